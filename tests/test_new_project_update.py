"""An update lands whole or not at all: a newer template commit at the same version is the library
the project then runs (its wheel installed over the older one, its metadata naming the commit);
a failed update leaves the project exactly as it was; a refused one commits nothing; names the
project's .gitignore ignores (or pytest's conftest) are refused as package names. Small
templates of test_new_project_safety.py, in a temp folder, under a throwaway git identity."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from test_new_project_safety import (
    FIT,
    FIT_PATH,
    NEW,
    SECRET,
    commit_file,
    git,
    git_identity,
    make_project,
    make_template,
    scaffold_path,
    update,
)

from conftest import REPO
from fasttrain.tools.new_project import RECORD, SCAFFOLD, TEMPLATE

__all__ = ["git_identity"]  # its autouse fixture, imported to apply here

PROJECT_PYPROJECT = """[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"
[project]
name = "{{ project_name }}"
version = "0.1.0"
dependencies = ["fasttrain=={{ fasttrain_version }}"]
[project.optional-dependencies]
dev = []
[tool.setuptools.packages.find]
where = ["src"]
"""
LIBRARY = '__version__ = "0.0.1"\n\n\ndef probe() -> str:\n    return "{}"\n'
OWN = {"src/acme_vision/__init__.py": "", "src/acme_vision/own.py": "NET = 'ours'\n"}


def snapshot(project: Path) -> dict[str, bytes]:
    """Every file of the project outside .git, ignored ones included, by content."""
    files = [p for p in project.rglob("*") if p.is_file() and ".git" not in p.parts]
    return {p.relative_to(project).as_posix(): p.read_bytes() for p in files}


def state(project: Path) -> tuple[str, str, str]:
    """Its history, index and working tree as git sees them."""
    return (git(project, "log", "--format=%H %s"), git(project, "ls-files", "-s"),
            git(project, "status", "--porcelain", "--ignored"))  # fmt: skip


def user_edits(project: Path) -> None:
    """The user's committed work: a Makefile target, a config edit, a file of their own and a
    file of the template's deleted; and a secret of theirs, ignored."""
    with (project / "Makefile").open("a") as make:
        make.write("ours:\n\techo ours\n")
    fit = project / FIT_PATH
    fit.write_text(fit.read_text().replace("step_1: 1", "step_1: 11  # ours"))
    (project / "src").mkdir()
    (project / "src" / "own.py").write_text("NET = 'ours'\n")
    git(project, "rm", "-q", "conf/old.yaml")
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "our work")
    (project / ".env").write_bytes(SECRET)


@pytest.mark.slow  # a render and a failed update (~15 s)
def test_a_failed_update_leaves_the_project_as_it_was(tmp_path: Path) -> None:
    template = make_template(tmp_path)
    commit_file(template, scaffold_path("Makefile"), "help:\n\techo help\n")
    project = tmp_path / NEW
    assert make_project(template, project).returncode == 0
    user_edits(project)
    # the template's next commit changes the scaffold, and its library no longer builds
    commit_file(template, scaffold_path(FIT_PATH), FIT.replace("step_9: 9", "step_9: 99"))
    commit_file(template, scaffold_path("conf/new.yaml"), "new: true\n")
    commit_file(template, "pyproject.toml", '[project]\nname = "fasttrain"\nversion = "x.y"\n')
    files, before = snapshot(project), state(project)
    assert [p for p in files if p.startswith("wheels/")]

    proc = update(project, template)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert f"building the {TEMPLATE} wheel" in proc.stderr and "built " not in proc.stderr
    assert state(project) == before
    assert snapshot(project) == files


@pytest.mark.slow  # a render and two refused updates (~10 s)
def test_a_refused_update_commits_nothing(tmp_path: Path) -> None:
    template = make_template(tmp_path)
    project = tmp_path / NEW
    assert make_project(template, project).returncode == 0
    other = tmp_path / "other"  # the same template from another place: FROM= a new source
    git(tmp_path, "clone", "-q", str(template), str(other))
    commit_file(other, scaffold_path(FIT_PATH), FIT.replace("step_9: 9", "step_9: 99"))
    (project / "notes.txt").write_text("mine\n")
    record, before = (project / RECORD).read_bytes(), state(project)

    proc = update(project, other)
    assert proc.returncode == 2 and "1 untracked file(s): notes.txt" in proc.stderr, proc.stderr
    assert state(project) == before and (project / RECORD).read_bytes() == record
    proc = subprocess.run([sys.executable, "-m", "fasttrain.tools.new_project", "update",
                           str(other), "--ref", "no-such-branch"], cwd=project,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "REF 'no-such-branch' is not a branch" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert state(project) == before


# What a project made before them gains from an update (the scaffold's own files).
GAINED = [".github/workflows/ci.yml.jinja", ".pre-commit-config.yaml", ".env.example"]


def tracked(project: Path) -> dict[str, bytes]:
    """The project's committed files, by content."""
    names = git(project, "ls-files", "-z").split("\0")
    return {name: (project / name).read_bytes() for name in names if name}


def project_venv(project: Path) -> Path:
    """The project's .venv as `make install` would make it, offline: a venv that sees this
    Python's packages (pip, setuptools, copier), fasttrain's left out, so the project runs the
    library it installs from wheels/ and nothing else."""
    venv = project / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = subprocess.run([str(python), "-c", where], capture_output=True, text=True,
                             check=True)  # fmt: skip
    host = project.parent / "host"
    host.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.lower().startswith(("fasttrain", "__editable__", "_fasttrain")):
            (host / entry.name).symlink_to(entry)
    Path(purelib.stdout.strip(), "host.pth").write_text(f"{host}\n")
    return python


def make_in(project: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", *args, "EXTRAS=dev"], cwd=project, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


@pytest.mark.slow  # a render, two installs and an update through make (~1 min)
def test_an_update_at_the_same_version_installs_the_newer_library(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    template = make_template(tmp_path)
    package = template / "src" / TEMPLATE
    (package / "tools" / "__init__.py").write_text("")
    (package / "__init__.py").write_text(LIBRARY.format("A"))
    scaffold = template / SCAFFOLD.relative_to(REPO)
    shutil.copy(SCAFFOLD / "Makefile", scaffold / "Makefile")
    (scaffold / "pyproject.toml.jinja").write_text(PROJECT_PYPROJECT)
    (scaffold / ".gitignore").write_text(".venv/\n*.egg-info/\n.env\n/data/\n")
    git(template, "add", "-A")
    git(template, "commit", "-q", "-m", "A")
    project = tmp_path / NEW
    assert make_project(template, project).returncode == 0
    for path, text in OWN.items():
        (project / path).parent.mkdir(parents=True, exist_ok=True)
        (project / path).write_text(text)
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "our package")
    python = project_venv(project)
    installed = make_in(project, "install")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    probe = "import fasttrain, importlib.metadata as m; "
    probe += "print(fasttrain.probe(), m.version('fasttrain'))"
    ran = subprocess.run([str(python), "-c", probe], cwd=project, capture_output=True, text=True)
    commit_a = git(template, "rev-parse", "HEAD").strip()
    assert ran.stdout.split() == ["A", f"0.0.1+g{commit_a[:12]}"], ran.stdout + ran.stderr
    # commit B changes a library function (the version stays 0.0.1), and its scaffold gains the
    # files a project made before them lacks: CI, pre-commit hooks, .env.example
    commit_file(template, f"src/{TEMPLATE}/__init__.py", LIBRARY.format("B"))
    for name in GAINED:
        commit_file(template, scaffold_path(name), (SCAFFOLD / name).read_text())
    commit_b = git(template, "rev-parse", "HEAD").strip()
    before = tracked(project)
    rendered = {name.removesuffix(".jinja") for name in GAINED}
    assert not rendered & set(before)  # a project made before them

    proc = make_in(project, "update-template", f"FROM={template}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = tracked(project)
    (old_wheel,) = [p for p in before if p.startswith("wheels/")]
    (new_wheel,) = [p for p in after if p.startswith("wheels/")]
    assert set(after) - set(before) == {*rendered, new_wheel}
    assert set(before) - set(after) == {old_wheel}
    # the project's own files byte for byte; only the record of the template's commit moved
    assert [p for p in before if p in after and after[p] != before[p]] == [RECORD]
    assert after[".pre-commit-config.yaml"] == (SCAFFOLD / ".pre-commit-config.yaml").read_bytes()
    assert after[".env.example"] == (SCAFFOLD / ".env.example").read_bytes()
    assert b'python-version: "3.10"' in after[".github/workflows/ci.yml"]  # the answer's
    ran = subprocess.run([str(python), "-c", probe], cwd=project, capture_output=True, text=True)
    assert ran.stdout.split() == ["B", f"0.0.1+g{commit_b[:12]}"], ran.stdout + ran.stderr
    assert git(project, "log", "-1", "--format=%s") == (
        f"{TEMPLATE} 0.0.1, the template at {commit_b[:12]}\n"
    )
    assert all((project / path).read_text() == text for path, text in OWN.items())
    assert git(project, "status", "--porcelain") == ""


NOT_A_PACKAGE = ["logs", "dist", "build", "outputs", "multirun", "lightning_logs", "conftest"]


@pytest.mark.parametrize("name", NOT_A_PACKAGE)
def test_a_name_the_project_ignores_or_pytest_owns_is_refused(name: str, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "fasttrain.tools.new_project", "create",
                           str(dest), "--package", name], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    why = "pytest's conftest" if name == "conftest" else ".gitignore ignores"
    assert proc.stderr.startswith(f"error: package name '{name}' ") and why in proc.stderr
    assert not dest.exists()


@pytest.mark.parametrize("name", NOT_A_PACKAGE)
def test_copier_refuses_the_same_names(name: str, tmp_path: Path) -> None:
    pytest.importorskip("copier")
    dest = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "copier", "copy", "--trust", "--defaults",
                           "-d", "project_name=x", "-d", f"package_name={name}", str(REPO),
                           str(dest)], capture_output=True, text=True, timeout=300)  # fmt: skip
    why = "pytest's conftest" if name == "conftest" else ".gitignore ignores"
    assert proc.returncode != 0 and why in proc.stdout + proc.stderr, proc.stderr[-2000:]
    assert not dest.exists()


@pytest.mark.slow  # a render and an update (~10 s)
def test_ref_may_be_a_commit_sha(tmp_path: Path) -> None:
    template = make_template(tmp_path)
    project = tmp_path / NEW
    assert make_project(template, project).returncode == 0
    commit_file(template, scaffold_path(FIT_PATH), FIT.replace("step_9: 9", "step_9: 99"))
    wanted = git(template, "rev-parse", "HEAD").strip()
    commit_file(template, scaffold_path(FIT_PATH), FIT.replace("step_9: 9", "step_9: 999"))
    proc = subprocess.run([sys.executable, "-m", "fasttrain.tools.new_project", "update",
                           str(template), "--ref", wanted], cwd=project, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.endswith(f"the template's {wanted[:12]}\n"), proc.stdout
    assert "step_9: 99\n" in (project / FIT_PATH).read_text()
