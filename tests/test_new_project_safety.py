"""Making a project and updating it leave a user's files alone: a new project gets the template
as committed (never the checkout's .env, data or uncommitted edits), and an update neither
deletes, overwrites nor commits the project's untracked files, and keeps its committed edits. A
small template of a few files (this checkout's copier.yml and new_project.py, a library of one
module, a scaffold of a README and a config), in a temp folder; git runs under a throwaway
identity, never the user's config."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from fasttrain.tools import new_project
from fasttrain.tools.new_project import RECORD, SCAFFOLD, TEMPLATE, create, read_record

pytest.importorskip("copier")

NEW = "acme_vision"
# Lines three apart: edits to two of them are separate hunks, which merge without conflict.
FIT = "".join(f"step_{i}: {i}\n\n\n" for i in range(12))
SECRET = b"TOKEN=not-for-the-template\n"
TOKENS = bytes(range(256)) * 16  # a token memmap
FIT_PATH = "conf/fit.yaml"  # in the project; the scaffold's in the template


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """A throwaway identity; no global or system config read (nor written)."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    for key in ("GIT_AUTHOR", "GIT_COMMITTER"):
        monkeypatch.setenv(f"{key}_NAME", "test")
        monkeypatch.setenv(f"{key}_EMAIL", "test@localhost")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def git(root: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(["git", *args], cwd=root, input=stdin, capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def make_template(root: Path) -> Path:
    """A committed template: copier.yml, the library (this checkout's new_project.py) with a
    pyproject that builds it, and a scaffold of a README, the answers record, conf/fit.yaml and
    conf/old.yaml."""
    template = root / "template"
    package = template / "src" / TEMPLATE
    (package / "tools").mkdir(parents=True)
    shutil.copy(new_project.__file__, package / "tools" / "new_project.py")
    (package / "__init__.py").write_text('__version__ = "0.0.1"\n')
    copier = re.sub(
        r'^  default: "\d+\.\d+\.\d+"$',
        '  default: "0.0.1"',
        (REPO / "copier.yml").read_text(),
        count=1,
        flags=re.M,
    )  # the version pinned
    (template / "copier.yml").write_text(copier)
    (template / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "{TEMPLATE}"\nversion = "0.0.1"\n'
        '[tool.setuptools.packages.find]\nwhere = ["src"]\n'
    )
    scaffold = template / SCAFFOLD.relative_to(REPO)
    (scaffold / "conf").mkdir(parents=True)
    answers = "{{ _copier_conf.answers_file }}.jinja"
    shutil.copy(SCAFFOLD / answers, scaffold / answers)
    (scaffold / "README.md.jinja").write_text("# {{ project_name }}\n")
    (scaffold / "pyproject.toml.jinja").write_text(
        'dependencies = ["fasttrain=={{ fasttrain_version }}"]\n'
    )
    (scaffold / FIT_PATH).write_text(FIT)
    (scaffold / "conf" / "old.yaml").write_text("retired: true\n")
    (scaffold / ".gitignore").write_text(".env\n/data/\n")  # as the real scaffold's
    (template / ".gitignore").write_text("logs/\n")
    git(template, "init", "-q")
    git(template, "add", "-A")
    git(template, "commit", "-q", "-m", "the template")
    return template


def scaffold_path(rel: str) -> str:
    return f"{SCAFFOLD.relative_to(REPO).as_posix()}/{rel}"


def work_in(template: Path) -> None:
    """The checkout as someone works in it: a secret, data, a run's log, an uncommitted edit."""
    (template / ".env").write_bytes(SECRET)
    (template / "data").mkdir()
    (template / "data" / "tokens.bin").write_bytes(TOKENS)
    (template / "logs").mkdir()
    (template / "logs" / "run.txt").write_text("ignored\n")
    fit = template / scaffold_path(FIT_PATH)
    fit.write_text(fit.read_text().replace("step_3: 3", "step_3: 33  # trying something"))


def commit_file(repo: Path, path: str, text: str | None) -> None:
    """Commit `text` as `path` (None: its removal) without touching the working tree, which
    keeps its uncommitted edits."""
    if text is None:
        git(repo, "rm", "-q", "--cached", path)
    else:
        blob = git(repo, "hash-object", "-w", "--stdin", stdin=text).strip()
        git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")
    git(repo, "commit", "-q", "-m", f"template: {path}")


def make_project(template: Path, dest: Path) -> subprocess.CompletedProcess:
    """`make new-project` without make: the template's own script."""
    script = template / "src" / TEMPLATE / "tools" / "new_project.py"
    return subprocess.run([sys.executable, str(script), "create", str(dest), "--package", NEW],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def update(project: Path, template: Path) -> subprocess.CompletedProcess:
    """`make update-template` without make, from the project's root."""
    return subprocess.run([sys.executable, new_project.__file__, "update", str(template)],
                          cwd=project, capture_output=True, text=True, timeout=300)  # fmt: skip


def test_create_copies_the_template_as_committed(tmp_path: Path, capsys) -> None:
    template = make_template(tmp_path)
    committed = git(template, "rev-parse", "HEAD").strip()
    create(tmp_path / "clean", NEW, src=template)
    assert capsys.readouterr().err == ""  # a clean checkout: nothing to say
    work_in(template)
    dest = create(tmp_path / NEW, NEW, src=template)
    for left_out in (".env", "data", "logs"):
        assert not (dest / left_out).exists(), f"{left_out} was copied"
    assert (dest / FIT_PATH).read_text() == FIT, "the uncommitted edit was copied"
    assert committed.startswith(read_record(dest)["_commit"])
    err = capsys.readouterr().err
    assert err == (f"note: copying the template as committed at {committed[:12]}; 3 uncommitted "
                   f"change(s) in {template.resolve()} are not copied\n")  # fmt: skip
    shipped = git(dest, "ls-tree", "-r", "--name-only", "HEAD").split()
    assert ".env" not in shipped and not [p for p in shipped if p.startswith("data/")]
    assert shipped.count(f"wheels/fasttrain-0.0.1+g{committed[:12]}-py3-none-any.whl") == 1


@pytest.mark.slow  # two renders, two wheels and copier's merge (~20 s): make test-slow
def test_update_keeps_the_users_files_and_edits(tmp_path: Path) -> None:
    template = make_template(tmp_path)
    work_in(template)
    project = tmp_path / NEW
    created = make_project(template, project)
    assert created.returncode == 0, created.stderr
    # the user's own secret and memmaps (those of the checkout: the same token, the same data),
    # and a committed edit to a file the template ships
    (project / ".env").write_bytes(SECRET)
    (project / "data").mkdir(exist_ok=True)
    (project / "data" / "tokens.bin").write_bytes(TOKENS)
    (project / "data" / "own.bin").write_bytes(TOKENS[::-1])
    fit = project / FIT_PATH
    fit.write_text(fit.read_text().replace("step_1: 1", "step_1: 11  # ours"))
    git(project, "commit", "-q", "-m", "our step", "--", FIT_PATH)
    ours = fit.read_text()
    # the template, still with its uncommitted work, gains a fix and drops old.yaml
    commit_file(template, scaffold_path(FIT_PATH), FIT.replace("step_9: 9", "step_9: 99  # fixed"))
    commit_file(template, scaffold_path("conf/old.yaml"), None)

    proc = update(project, template)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    head = git(template, "rev-parse", "HEAD").strip()
    assert proc.stdout == f"updated to {TEMPLATE} 0.0.1, the template's {head[:12]}\n"
    assert (project / ".env").read_bytes() == SECRET
    assert (project / "data" / "tokens.bin").read_bytes() == TOKENS
    assert (project / "data" / "own.bin").read_bytes() == TOKENS[::-1]
    # the template's fix in, every other line as the project had it
    assert fit.read_text() == ours.replace("step_9: 9", "step_9: 99  # fixed")
    assert not (project / "conf" / "old.yaml").exists()
    assert head.startswith(read_record(project)["_commit"])
    assert git(project, "status", "--porcelain", "--untracked-files=no") == ""
    committed = git(project, "ls-tree", "-r", "--name-only", "HEAD").split()
    assert ".env" not in committed and not [p for p in committed if p.startswith("data/")]
    assert created.stderr.startswith("note: copying the template as committed at ")


@pytest.mark.slow  # a render and a refused update (~10 s)
def test_update_refuses_to_overwrite_files_the_project_does_not_track(tmp_path: Path) -> None:
    template = make_template(tmp_path)
    project = tmp_path / NEW
    assert make_project(template, project).returncode == 0
    (project / ".env").write_bytes(SECRET)  # ignored: copier would overwrite them silently
    (project / "data").mkdir()
    (project / "data" / "README.md").write_text("our notes\n")
    commit_file(template, scaffold_path(".env"), "TOKEN=\n")  # the template starts shipping both
    commit_file(template, scaffold_path("data/README.md"), "Put data here.\n")
    before = git(project, "rev-parse", "HEAD")

    proc = update(project, template)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "2 file(s) the project does not track: .env, data/README.md;" in proc.stderr
    assert (project / ".env").read_bytes() == SECRET
    assert (project / "data" / "README.md").read_text() == "our notes\n"
    assert git(project, "rev-parse", "HEAD") == before  # nothing changed
    assert RECORD in git(project, "ls-files")
    # a file neither tracked nor ignored: copier would refuse it in words of its own
    commit_file(template, scaffold_path(".env"), None)
    commit_file(template, scaffold_path("data/README.md"), None)
    (project / "notes.txt").write_text("mine\n")
    proc = update(project, template)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "1 untracked file(s): notes.txt; add them to git or .gitignore" in proc.stderr
    assert git(project, "rev-parse", "HEAD") == before
