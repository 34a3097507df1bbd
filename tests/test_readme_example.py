"""The README's "Add your own net, data set or task" examples, taken verbatim from README.md:
each is new files only, and trains, evaluates, exports and predicts with no other edit. The
default test loads them in this process over a copy of conf/; the slow one writes them into a
copy of the repository and runs the commands and the generic tests there, unchanged."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from conftest import CONF, REPO, run_cli, run_dirs

SHORT = ["++trainer.max_epochs=2", "++trainer.limit_train_batches=4", "data.num_workers=0",
         "logger=none"]  # fmt: skip
# What the README example adds, as a user runs each: (train overrides, data group).
RUNS = {
    "net": (["model/net=res_mlp"], "digits"),
    "data set": (["data=breast_cancer", "model=mlp"], "breast_cancer"),
    "task": (["model=poisson", "data=diabetes"], "diabetes"),
}


def readme_files() -> dict[str, str]:
    """Each README code block whose first line is `# <path under src/ or conf/>`: path -> text."""
    text = (REPO / "README.md").read_text()
    start = text.index("## Add your own net, data set or task")
    section = text[start : text.index("\n## ", start + 1)]
    found = {}
    for block in re.findall(r"```(?:python|yaml)\n(.*?)```", section, re.S):
        head = re.match(r"# ((?:src|conf)/\S+)", block)
        if head:
            found[head.group(1)] = block
    return found


def test_the_readme_adds_a_net_a_data_set_and_a_task_as_new_files_only() -> None:
    files = readme_files()
    folders = {str(Path(p).parent) for p in files}
    assert folders == {"src/fasttrain/models/nets", "conf/model/net", "src/fasttrain/data",
                       "conf/data", "src/fasttrain/models", "conf/model"}, folders  # fmt: skip
    assert not [p for p in files if (REPO / p).exists()], "the examples must be new files"


@pytest.fixture(scope="module")
def added(tmp_path_factory: pytest.TempPathFactory):
    """conf/ with the README's configs added, and its modules importable under their names."""
    conf = tmp_path_factory.mktemp("added") / "conf"
    shutil.copytree(CONF, conf)
    names = []
    for path, text in readme_files().items():
        if path.startswith("conf/"):
            (conf / path.removeprefix("conf/")).write_text(text)
            continue
        file = tmp_path_factory.mktemp("src") / Path(path).name
        file.write_text(text)
        name = path.removeprefix("src/").removesuffix(".py").replace("/", ".")
        spec = importlib.util.spec_from_file_location(name, file)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        names.append(name)
    yield conf
    for name in names:
        sys.modules.pop(name, None)


def entry(conf: Path, name: str, out: Path, overrides: list[str]) -> DictConfig:
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose(name, overrides=[*overrides, f"paths.root_dir={out}",
                                        f"paths.output_dir={out}/run"])  # fmt: skip


@pytest.mark.parametrize("what", RUNS)
def test_each_example_trains_evaluates_exports_and_predicts(
    what: str, added: Path, tmp_path: Path
) -> None:
    from fasttrain.tasks import evaluate, export, predict, train

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


@pytest.mark.slow  # copies the repository, ~2 min of processes: CI runs it in make test-slow
def test_examples_in_a_copy_pass_the_unchanged_suite(tmp_path: Path) -> None:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    copy = tmp_path / "copy"
    for rel in listed:
        if (REPO / rel).is_file():
            (copy / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, copy / rel)
    for path, text in readme_files().items():
        (copy / path).write_text(text)
    env = {"PYTHONPATH": str(copy / "src")}
    for overrides, data in RUNS.values():
        log = tmp_path / "logs"
        proc = run_cli(["train.py", *overrides, *SHORT, "run_name=x"], log, cwd=copy, **env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        ckpt = f"ckpt_path={log}/train/x/checkpoints/last.ckpt"
        for command in ("fasttrain.evaluate", "fasttrain.predict"):
            proc = run_cli(["-m", command, ckpt, f"data={data}"], log, cwd=copy, **env)
            assert proc.returncode == 0, proc.stderr[-3000:]
        proc = run_cli(["-m", "fasttrain.export", ckpt, f"data={data}", "format=torchscript"], log,
                       cwd=copy, **env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        shutil.rmtree(log)
    # The generic tests take the additions as they are (no test edit).
    pick = "res_mlp or breast_cancer or poisson or readme_layout"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", pick,
         "tests/test_tasks.py", "tests/test_configs.py", "tests/test_architecture.py"],
        cwd=copy, env={**__import__("os").environ, **env, "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:]
    ran = re.search(r"(\d+) passed", proc.stdout)
    assert ran and int(ran.group(1)) >= 10, proc.stdout[-2000:]
    assert not run_dirs(copy / "logs")  # the suite wrote no run into the copy's logs/
