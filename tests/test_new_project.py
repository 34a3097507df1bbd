"""A new project in one command: thin (the scaffold rendered for its names, the library pinned as
a wheel, never copied), a git repository, and its suite passes on the library it pins; a newer
fasttrain comes in by `update` with the project's own files untouched. Generated into a temp
folder; this checkout's Python runs it, the project's wheel unpacked onto PYTHONPATH in place
of an install."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fasttrain
from conftest import CONF, REPO, make_new_project
from fasttrain.tools.new_project import RECORD, SCAFFOLD, TEMPLATE, read_record

NEW = "acme_vision"
# a new project's own Python outside tests/ (issue target): train.py and the three examples
OWN_PYTHON_LINES = 600


# its suite as `make test` runs it: test files in parallel, one worker per CPU
PARALLEL = ["-n", "logical", "--dist", "loadfile"] if importlib.util.find_spec("xdist") else []


def unpack_library(project: Path, dest: Path) -> Path:
    """The fasttrain wheel the project pins, installed into `dest` (no dependencies: this
    Python has them), for PYTHONPATH: the project runs that library, not this checkout."""
    (wheel,) = (project / "wheels").glob(f"{TEMPLATE}-*.whl")
    shutil.rmtree(dest, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(dest), str(wheel)], check=True, capture_output=True)  # fmt: skip
    return dest


def in_project(project: Path, library: Path, *args: str, timeout: int = 3600):
    """`python *args` in the project, on its own library and its src/."""
    env = {**os.environ, "PYTHONPATH": f"{library}{os.pathsep}{project / 'src'}",
           "CUDA_VISIBLE_DEVICES": ""}  # fmt: skip
    return subprocess.run([sys.executable, *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


def own_python_lines(project: Path) -> int:
    files = [p for p in project.rglob("*.py") if "tests" not in p.relative_to(project).parts]
    return sum(len(p.read_text().splitlines()) for p in files)


def check_made(project: Path, package: str) -> None:
    own = project / "src" / package
    assert sorted(p.name for p in own.iterdir()) == ["__init__.py", "breast_cancer.py",
                                                     "poisson.py", "res_mlp.py"]  # fmt: skip
    assert not (project / "src" / TEMPLATE).exists(), "the machinery was copied"
    for junk in (".venv", "logs", ".pytest_cache", "copier.yml", "bench"):
        assert not (project / junk).exists(), f"{junk} was copied"
    assert not list(project.rglob("__pycache__"))
    assert own_python_lines(project) <= OWN_PYTHON_LINES
    leftovers = [str(p.relative_to(project)) for p in project.rglob("*")
                 if p.is_file() and ".git" not in p.parts and p.suffix != ".whl"
                 and ("{{" in p.read_text() or p.name.endswith(".jinja"))]  # fmt: skip
    assert not leftovers, leftovers
    # the library pinned at this version, its wheel beside
    version = fasttrain.__version__
    pyproject = (project / "pyproject.toml").read_text()
    project_name = package.replace("_", "-")
    assert f'name = "{project_name}"' in pyproject
    assert f'"{TEMPLATE}=={version}"' in pyproject
    # the version labelled with the commit it was built from
    recorded = read_record(project)["_commit"]
    commit = git(REPO, "rev-parse", f"{recorded}^{{commit}}").strip()
    assert [p.name for p in (project / "wheels").iterdir()] == [
        f"{TEMPLATE}-{version}+g{commit[:12]}-py3-none-any.whl"
    ]
    assert (project / "README.md").read_text().startswith(f"# {project_name}\n")
    # every config of the library's comes along unchanged, and the examples' name the package
    for file in CONF.rglob("*.yaml"):
        rel = file.relative_to(CONF)
        assert (project / "conf" / rel).read_bytes() == file.read_bytes(), rel
    net = (project / "conf/model/net/res_mlp.yaml").read_text()
    assert f"_target_: {package}.res_mlp.ResMLP" in net
    log = subprocess.run(["git", "log", "--oneline"], cwd=project, capture_output=True, text=True)
    assert len(log.stdout.splitlines()) == 1, log.stdout + log.stderr
    status = subprocess.run(["git", "status", "--porcelain"], cwd=project, capture_output=True)
    assert status.stdout == b"", "the first commit left files out"
    record = read_record(project)
    assert record["package_name"] == package and record["project_name"] == project_name
    assert record["_src_path"] == f"git+file://{REPO}" and record["_commit"]


@pytest.fixture
def project(new_project: Path) -> Path:
    return new_project  # the session's (conftest.py), shared with test_new_project_ci.py


def test_make_new_project_makes_a_thin_project(project: Path) -> None:
    check_made(project, NEW)


def test_the_scaffold_carries_every_config_file() -> None:
    """The scaffold's conf/ links to the library's files (folders the examples add to are
    folders of links): a config added to conf/ and not to the scaffold is caught here."""
    dangling = [str(p) for p in SCAFFOLD.rglob("*") if p.is_symlink() and not p.exists()]
    assert not dangling, dangling
    for file in CONF.rglob("*.yaml"):
        rel = file.relative_to(CONF)
        linked = SCAFFOLD / "conf" / rel
        assert linked.exists() and linked.resolve() == file.resolve(), (
            f"conf/{rel} is not in the scaffold: ln -s (relative) it under {linked.parent}"
        )


@pytest.mark.slow  # ~30 s: CI runs it in make test-slow
def test_new_project_runs_on_the_library_it_pins(project: Path, tmp_path: Path) -> None:
    library = unpack_library(project, tmp_path / "lib")
    quick = "every_config_file or interpolates or (instantiates and train.yaml)"
    proc = in_project(project, library, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      "tests/test_fasttrain.py", "-k", quick)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout
    where = in_project(project, library, "-c", "import fasttrain; print(fasttrain.__file__)")
    assert where.stdout.startswith(str(library)), where.stdout + where.stderr


IDENT = ["-c", "user.name=test", "-c", "user.email=test@localhost"]


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *IDENT, *args], cwd=root, capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def own_files(package: str) -> dict[str, str]:
    """A net, a data set and a task a user adds (the README's examples, under names of their
    own) in the project's package."""
    from test_readme_example import readme_files

    names = {"res_mlp": "wide_mlp", "breast_cancer": "cancer", "poisson": "counts"}
    # Whole names after a path, module or override separator: F.poisson_nll_loss stays torch's.
    renamed = {**{rf"(?<=[./=]){old}\b": new for old, new in names.items()},
               r"\bResMLP\b": "WideMLP", r"\bBreastCancer\b": "Cancer",
               r"\bPoissonRegressor\b": "Counts", r"\bacme_vision\b": package}  # fmt: skip
    own = {}
    for path, text in readme_files().items():
        for old, new in renamed.items():
            path, text = re.sub(old, new, path), re.sub(old, new, text)
        own[path] = text
    assert len(own) == 6, sorted(own)  # net, data set and task: module and config each
    return own


VERSION_B = "99.0.0"  # the template's next version, in commit B


def bump_version(template: Path, version: str) -> None:
    """Commit B's version, everywhere it is written (tests/test_public_api.py keeps them one)."""
    edits = {"pyproject.toml": r'^version = ".*"$', "copier.yml": r'^  default: "\d+\.\d+\.\d+"$',
             f"src/{TEMPLATE}/__init__.py": r'^__version__ = "[^"]*"'}  # fmt: skip
    for rel, pattern in edits.items():
        path = template / rel
        text, n = re.subn(pattern, lambda m: re.sub(r"\d+\.\d+\.\d+", version, m.group(0)),
                          path.read_text(), count=1, flags=re.M)  # fmt: skip
        assert n == 1, rel
        path.write_text(text)


@pytest.fixture(scope="module")
def updated(tmp_path_factory: pytest.TempPathFactory):
    """(a new project, the files it added, its template, the updated library): made from a
    clone of this template (commit A), given a net, a data set and a task of its own
    (committed); then the template's commit B changed a library function, added its test and
    moved the version, and `update` brought B in."""
    root = tmp_path_factory.mktemp("update")
    template, project = root / "template", root / NEW
    git(root, "clone", "-q", str(REPO), str(template))  # the template as committed
    script = template / "src" / TEMPLATE / "tools" / "new_project.py"
    subprocess.run([sys.executable, str(script), "create", str(project), "--package", NEW],
                   check=True, capture_output=True)  # fmt: skip
    own = own_files(NEW)
    for path, text in own.items():
        (project / path).write_text(text)
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "a net, a data set and a task of our own")
    fit = template / "src" / TEMPLATE / "fit" / "__init__.py"
    fixed = fit.read_text().replace("Everything around", "Everything (updated) around", 1)
    fit.write_text(fixed + f'\n\ndef update_probe() -> str:\n    return "{TEMPLATE}"\n')
    (template / "tests" / "test_update_probe.py").write_text(
        f"from {TEMPLATE}.fit import update_probe\n\n\ndef test_probe() -> None:\n"
        f"    assert update_probe() == {TEMPLATE!r}\n"
    )
    bump_version(template, VERSION_B)
    git(template, "add", "-A")
    git(template, "commit", "-q", "-m", "a machinery fix")
    library_a = unpack_library(project, root / "lib_a")
    proc = in_project(project, library_a, "-m", "fasttrain.tools.new_project", "update",
                      str(template), timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith(f"updated to {TEMPLATE} {VERSION_B}, the template's ")
    return project, own, template, unpack_library(project, root / "lib_b")


@pytest.mark.slow  # two renders, two wheels and copier's merge (~1 min): make test-slow
def test_update_brings_the_library_in_and_keeps_the_projects_own(updated) -> None:
    project, own, template, library = updated
    assert all((project / path).read_text() == text for path, text in own.items())
    assert f'"{TEMPLATE}=={VERSION_B}"' in (project / "pyproject.toml").read_text()
    head = git(template, "rev-parse", "HEAD").strip()
    assert [p.name for p in (project / "wheels").iterdir()] == [
        f"{TEMPLATE}-{VERSION_B}+g{head[:12]}-py3-none-any.whl"
    ]
    probe = "from fasttrain.fit import update_probe; import importlib.metadata as m; "
    probe += "print(update_probe(), m.version('fasttrain'))"
    ran = in_project(project, library, "-c", probe)
    assert ran.stdout.split() == [TEMPLATE, f"{VERSION_B}+g{head[:12]}"], ran.stdout + ran.stderr
    recorded = read_record(project)["_commit"]
    assert git(template, "rev-parse", f"{recorded}^{{commit}}").strip() == head
    assert git(project, "status", "--porcelain") == ""
    assert git(project, "log", "-1", "--format=%s").startswith(f"{TEMPLATE} {VERSION_B}, ")
    again = in_project(project, library, "-m", "fasttrain.tools.new_project", "update",
                       str(template), timeout=600)  # fmt: skip
    assert again.returncode == 0 and "nothing to update" in again.stdout, again.stderr


@pytest.mark.slow
def test_updated_project_passes_its_suite(updated) -> None:
    # its own net, data set and task, through the library's generic tests of version B
    project, _, _, library = updated
    proc = in_project(project, library, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      "-m", "not slow", "-x", *PARALLEL)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    listed = in_project(project, library, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider")
    for name in ("wide_mlp", "cancer", "counts"):
        assert name in listed.stdout, f"the generic tests do not pick up {name}"


@pytest.mark.slow  # each command a process on the project's library (~1 min)
def test_the_new_projects_examples_train_evaluate_export_and_predict(
    project: Path, tmp_path: Path
) -> None:
    library = unpack_library(project, tmp_path / "lib")
    short = ["++trainer.max_epochs=2", "++trainer.limit_train_batches=4", "data.num_workers=0",
             "logger=none", "run_name=x"]  # fmt: skip
    runs = {"net": (["model/net=res_mlp"], "digits"),
            "data set": (["data=breast_cancer", "model=mlp"], "breast_cancer"),
            "task": (["model=poisson", "data=diabetes"], "diabetes")}  # fmt: skip
    for what, (overrides, data) in runs.items():
        proc = in_project(project, library, "train.py", *overrides, *short)
        assert proc.returncode == 0, what + proc.stderr[-3000:]
        ckpt = f"ckpt_path={project}/logs/train/x/checkpoints/last.ckpt"
        for command in ("fasttrain.evaluate", "fasttrain.predict"):
            proc = in_project(project, library, "-m", command, ckpt, f"data={data}")
            assert proc.returncode == 0, what + proc.stderr[-3000:]
        proc = in_project(project, library, "-m", "fasttrain.export", ckpt, f"data={data}",
                          "format=torchscript")  # fmt: skip
        assert proc.returncode == 0, what + proc.stderr[-3000:]
        shutil.rmtree(project / "logs")


def test_update_refuses_what_it_cannot_take(project: Path, tmp_path: Path) -> None:
    def update(root: Path, *source: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "fasttrain.tools.new_project", "update",
                               *source, "--root", str(root)], capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    proc = update(tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: no {RECORD} in ")
    other = tmp_path / "other"  # a git repository that is not the template
    other.mkdir()
    (other / "a.txt").write_text("a")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "a"]):
        git(other, *args)
    proc = update(project, str(other))
    assert proc.returncode == 2 and "is not the fasttrain template" in proc.stderr
    readme = project / "README.md"
    kept = readme.read_text()
    readme.write_text(kept + "a change not yet committed\n")
    try:
        proc = update(project)
        assert proc.returncode == 2 and "uncommitted changes: commit or stash" in proc.stderr
        assert readme.read_text().endswith("a change not yet committed\n")  # nothing touched
    finally:
        readme.write_text(kept)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("acme-vision", "not a valid Python identifier"),
        ("class", "not a valid Python identifier"),
        ("_", "must start with a letter and end with a letter or digit"),
        ("acme_", "must start with a letter and end with a letter or digit"),
        ("train", "is the name of the project's own train.py"),
        ("conf", "is the name of the project's own conf"),
    ],
)
def test_bad_package_name_is_refused(name: str, message: str, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    proc = make_new_project(dest, name)
    assert proc.returncode != 0 and message in proc.stderr
    assert not dest.exists()


@pytest.mark.parametrize("name", ["torch", "os", "json", "lightning", "sklearn", "fasttrain"])
def test_a_name_that_shadows_a_module_is_refused(name: str, tmp_path: Path) -> None:
    dest = tmp_path / "out"
    proc = make_new_project(dest, name)
    assert proc.returncode == 2, proc.stderr
    assert f"package name '{name}' shadows the importable module {name}" in proc.stderr
    assert not dest.exists()


def test_non_empty_destination_is_refused(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    proc = make_new_project(tmp_path)
    assert proc.returncode != 0 and "exists and is not empty" in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_copier_copy_gives_the_same_project(tmp_path: Path) -> None:
    pytest.importorskip("copier")
    copier = [sys.executable, "-m", "copier", "copy", "--trust", "--defaults", "--vcs-ref", "HEAD"]
    dest = tmp_path / NEW
    proc = subprocess.run(
        [*copier, "-d", f"project_name={NEW.replace('_', '-')}", f"git+file://{REPO}", str(dest)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    git(dest, "init", "-q")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "new")
    check_made(dest, NEW)
    bad = subprocess.run(
        [*copier, "-d", "project_name=x", "-d", "package_name=acme-vision", str(REPO),
         str(tmp_path / "bad")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert bad.returncode != 0 and "not a valid Python identifier" in bad.stdout + bad.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow  # a render, an update that conflicts and one after it (~20 s)
def test_an_update_dropped_with_reset_hard_leaves_nothing_in_the_next_ones_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The conflict message says `git reset --hard` drops the update: the update's new files too
    (left untracked, the next update refused them as files it would overwrite)."""
    import test_new_project_safety as small  # its small template and throwaway git identity

    for key in ("GIT_AUTHOR", "GIT_COMMITTER"):
        monkeypatch.setenv(f"{key}_NAME", "test")
        monkeypatch.setenv(f"{key}_EMAIL", "test@localhost")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    template = small.make_template(tmp_path)
    project = tmp_path / NEW
    assert small.make_project(template, project).returncode == 0
    fit = project / small.FIT_PATH
    fit.write_text(fit.read_text().replace("step_1: 1", "step_1: 11  # ours"))
    git(project, "commit", "-q", "-am", "ours")
    theirs = small.FIT.replace("step_1: 1", "step_1: 12  # theirs")
    small.commit_file(template, small.scaffold_path(small.FIT_PATH), theirs)
    small.commit_file(template, small.scaffold_path("conf/new.yaml"), "new: true\n")

    proc = small.update(project, template)
    assert proc.returncode == 1 and "git reset --hard to drop the update" in proc.stderr
    git(project, "reset", "-q", "--hard")
    assert not (project / "conf" / "new.yaml").exists()
    assert git(project, "status", "--porcelain") == ""
    proc = small.update(project, template)  # the same conflict again, not a refusal
    assert proc.returncode == 1 and "conflicts with the project's changes" in proc.stderr


def test_the_printed_cd_command_works_for_a_folder_with_spaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fasttrain.tools import new_project

    dest = tmp_path / "my projects" / NEW
    dest.mkdir(parents=True)
    monkeypatch.setattr(new_project, "create", lambda *args, **kwargs: dest)
    assert new_project.main(["create", str(dest), "--package", NEW]) == 0
    command = capsys.readouterr().out.split(": ", 1)[1]
    done = subprocess.run(["bash", "-c", command.replace("make test", "pwd")],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == str(dest), done.stderr


PLAIN_MODULE = '''"""A plain LightningModule, as lightning-hydra-template writes one."""

from typing import Any

import lightning as L
import torch
import torch.nn.functional as F


class LitPlain(L.LightningModule):
    def __init__(self, net: torch.nn.Module, optimizer: Any) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["net"])
        self.net, self.optimizer = net, optimizer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.float())

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val/loss", F.cross_entropy(self(x), y))

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test/loss", F.cross_entropy(self(x), y))

    def configure_optimizers(self) -> Any:
        return self.optimizer(self.parameters())
'''


@pytest.mark.slow  # a process collecting the project's generic tests, one plain case (~40 s)
def test_a_plain_module_in_conf_model_is_tested_as_any_module(
    project: Path, tmp_path: Path
) -> None:
    """A plain LightningModule in the project's conf/model: the generic tests still collect
    (no Task's attributes asked of it) and train, evaluate and resume it."""
    own = tmp_path / "project"
    shutil.copytree(project, own, symlinks=True)
    (own / "src" / NEW / "lit_plain.py").write_text(PLAIN_MODULE)
    (own / "conf" / "model" / "lit_plain.yaml").write_text(
        f"defaults:\n  - _self_\n  - net: mlp\n  - optimizer: adamw\n\n"
        f"_target_: {NEW}.lit_plain.LitPlain\n"
    )
    library = unpack_library(own, tmp_path / "lib")
    proc = in_project(own, library, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      "tests/test_fasttrain.py", "-k", "lit_plain")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    assert "test_a_plain_module_trains_evaluates_and_resumes" in in_project(
        own, library, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
        "tests/test_fasttrain.py", "-k", "lit_plain").stdout  # fmt: skip


def test_the_new_project_script_imports_only_the_standard_library() -> None:
    """copier runs new_project.py as a script (copier.yml's task) with the project's Python,
    whose installed fasttrain may be older than the template: an import of the package there
    would fail, or load the older code."""
    import ast

    from fasttrain.tools import new_project

    tree = ast.parse(Path(new_project.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}  # fmt: skip
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}  # fmt: skip
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
