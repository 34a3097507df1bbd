"""The "Add your own net, data set or task" examples, taken verbatim from docs/your-code.md:
each is new files only in a project's package, and trains, evaluates, exports and predicts with
no other edit. They are the examples a new project starts with (the scaffold carries them);
here they are loaded in this process over a copy of conf/, and tests/test_new_project.py runs
them in a new project."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from conftest import CONF, REPO, doc
from fasttrain.tools.new_project import SCAFFOLD

# the package a new project's own code is in, as docs/your-code.md names it
PACKAGE = "acme_vision"

SHORT = ["++trainer.max_epochs=2", "++trainer.limit_train_batches=4", "data.num_workers=0",
         "logger=none"]  # fmt: skip
# What each example adds, as a user runs it: (train overrides, data group).
RUNS = {
    "net": (["model/net=res_mlp"], "digits"),
    "data set": (["data=breast_cancer", "model=mlp"], "breast_cancer"),
    "task": (["model=poisson", "data=diabetes"], "diabetes"),
}


def readme_files() -> dict[str, str]:
    """Each code block of docs/your-code.md ("Add your own net, data set or task") whose first line
    is `# <path under src/ or conf/>`: path -> text. (Named for where the examples used to be.)"""
    found = {}
    for block in re.findall(r"```(?:python|yaml)\n(.*?)```", doc("your-code"), re.S):
        head = re.match(r"# ((?:src|conf)/\S+)", block)
        if head:
            found[head.group(1)] = block
    return found


def test_the_readme_adds_a_net_a_data_set_and_a_task_as_new_files_only() -> None:
    files = readme_files()
    folders = {str(Path(p).parent) for p in files}
    assert folders == {f"src/{PACKAGE}", "conf/model/net", "conf/data", "conf/model"}, folders
    assert not [p for p in files if (REPO / p).exists()], "the examples must be new files"


def test_the_example_task_is_at_most_40_lines() -> None:
    task = readme_files()[f"src/{PACKAGE}/poisson.py"]
    assert "(Task)" in task and len(task.splitlines()) <= 40, len(task.splitlines())


def test_a_new_project_starts_with_the_readme_examples() -> None:
    for path, text in readme_files().items():
        rel = path.replace(PACKAGE, "{{ package_name }}")
        templated = text.replace(PACKAGE, "{{ package_name }}")
        file = SCAFFOLD / (rel + ".jinja" if templated != text else rel)
        assert file.read_text() == templated, f"{file} is not docs/your-code.md's {path}"


@pytest.fixture(scope="module")
def added(tmp_path_factory: pytest.TempPathFactory):
    """conf/ with the examples' configs added, and its modules importable as a project's package."""
    conf = tmp_path_factory.mktemp("added") / "conf"
    shutil.copytree(CONF, conf)
    src = tmp_path_factory.mktemp("src")
    (src / PACKAGE).mkdir()
    (src / PACKAGE / "__init__.py").write_text("")
    for path, text in readme_files().items():
        dest = (
            conf / path.removeprefix("conf/")
            if path.startswith("conf/")
            else src / path.removeprefix("src/")
        )
        dest.write_text(text)
    sys.path.insert(0, str(src))
    yield conf
    sys.path.remove(str(src))
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(f"{PACKAGE}.")]:
        sys.modules.pop(name)


def entry(conf: Path, name: str, out: Path, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose(name, overrides=[*overrides, f"paths.root_dir={out}",
                                        f"paths.output_dir={out}/run"])  # fmt: skip


@pytest.mark.parametrize("what", RUNS)
def test_each_example_trains_evaluates_exports_and_predicts(
    what: str, added: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fasttrain.checkpoints import allow
    from fasttrain.tasks import evaluate, export, predict, train

    # the copy is the project's conf/: checkpoints may name what it names, as in a project
    project_targets = allow.conf_targets(str(added))
    monkeypatch.setattr(allow, "conf_targets", lambda config_dir="": project_targets)

    overrides, data = RUNS[what]
    metrics = train(entry(added, "train", tmp_path / "t", [*overrides, *SHORT]))
    ckpt = tmp_path / "t" / "run" / "checkpoints" / "last.ckpt"
    assert ckpt.is_file() and metrics
    from_ckpt = [f"ckpt_path={ckpt}", f"data={data}", "data.num_workers=0"]
    evaluated = evaluate(entry(added, "eval", tmp_path / "e", from_ckpt))
    assert evaluated and all(k.startswith("test/") for k in evaluated)
    report = export(entry(added, "export", tmp_path / "x",
                          [*from_ckpt, "format=torchscript", "latency_time=0.01"]))  # fmt: skip
    assert report["formats"]["torchscript"]["passed"], report["formats"]
    out = predict(entry(added, "predict", tmp_path / "p", [*from_ckpt, f"output_dir={tmp_path}"]))
    lines = out.read_text().splitlines()
    assert lines[0].startswith("index,") and len(lines) > 10
