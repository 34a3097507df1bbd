"""The entry points as a user runs them: `python train.py`, `python -m fasttrain.evaluate`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, final_metrics, run_cli, run_dirs, scalars, session_hparams, verdict


@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`python train.py` with the shipped defaults (CNN on digits), from an empty folder."""
    launch = tmp_path_factory.mktemp("launch")
    log_dir = launch / "logs"
    proc = run_cli([str(REPO / "train.py")], log_dir, timeout=900, cwd=launch)
    assert proc.returncode == 0, proc.stderr[-3000:]
    DEFAULT_OUTPUT.append(proc)
    (run,) = run_dirs(log_dir)
    return run


DEFAULT_OUTPUT: list[subprocess.CompletedProcess] = []  # what the default run printed


def test_default_run_prints_a_tensorboard_command_that_works_as_printed(default_run: Path) -> None:
    launch = default_run.parents[2]
    line = next(x for x in DEFAULT_OUTPUT[0].stdout.splitlines() if x.startswith("TensorBoard"))
    exe, *args = line.split()[1:]
    assert (launch / exe).is_file() and os.access(launch / exe, os.X_OK), line  # no bare name
    logdir = launch / args[args.index("--logdir") + 1]
    assert logdir == launch / "logs" and default_run.is_relative_to(logdir)


def test_default_run_prints_no_adverts(default_run: Path) -> None:
    printed = DEFAULT_OUTPUT[0].stdout + DEFAULT_OUTPUT[0].stderr
    assert "litlogger" not in printed and "Tip:" not in printed


def test_default_run_reaches_accuracy_bar(default_run: Path) -> None:
    assert final_metrics(default_run)["test/acc"] >= 0.97


def test_default_run_writes_only_its_run_dir(default_run: Path) -> None:
    launch = default_run.parents[2]
    assert sorted(p.name for p in launch.iterdir()) == ["logs"]  # no outputs/, lightning_logs/
    assert (default_run / ".hydra" / "config.yaml").is_file()
    assert (default_run / "checkpoints" / "last.ckpt").is_file()


def test_tensorboard_events_hold_val_and_test_accuracy(default_run: Path) -> None:
    tags = scalars(default_run)
    assert {"train/loss_step", "val/loss", "val/acc"} <= set(tags)
    assert len(tags["val/acc"]) == 15  # one per epoch (trainer.max_epochs)
    # Test values are single points: among the run's results (HPARAMS), not its curves.
    assert not any(name.startswith("test/") for name in tags)
    test_acc = verdict(default_run)["verdict/task/classifier/test/acc"]
    assert test_acc == [pytest.approx(final_metrics(default_run)["test/acc"])]
    # A default run's HPARAMS session names its data and model options like an override would
    # (parallel coordinates skip a session that lacks a shown column).
    hparams = session_hparams(default_run)
    assert (hparams["data"], hparams["model"]) == ("digits", "cnn")


def test_checkpoint_loads_with_weights_only(default_run: Path) -> None:
    ckpt = torch.load(default_run / "checkpoints" / "last.ckpt", weights_only=True)
    net = ckpt["hyper_parameters"]["net"]
    assert net["_target_"] == "fasttrain.models.nets.cnn.SmallCNN"
    assert net["input_shape"] == [1, 8, 8] and net["num_classes"] == 10


@pytest.mark.slow  # 10-15 s of processes: CI runs it in make test-slow
def test_evaluate_reproduces_test_metrics(default_run: Path, tmp_path: Path) -> None:
    best = final_metrics_checkpoint(default_run)
    proc = run_cli(["-m", "fasttrain.evaluate", f"ckpt_path={best}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (eval_run,) = run_dirs(tmp_path, "eval")
    trained, evaluated = final_metrics(default_run), final_metrics(eval_run)
    assert evaluated["test/acc"] == pytest.approx(trained["test/acc"], abs=1e-6)
    assert evaluated["test/loss"] == pytest.approx(trained["test/loss"], rel=1e-5)


def final_metrics_checkpoint(run: Path) -> str:
    import json

    ckpt = json.loads((run / "metrics.json").read_text())["checkpoint"]
    assert ckpt and Path(ckpt).is_file() and Path(ckpt).name != "last.ckpt"
    return ckpt


@pytest.mark.slow  # tens of seconds: CI runs it in make test-slow
def test_fast_dev_run_and_overrides(tmp_path: Path) -> None:
    proc = run_cli(
        ["train.py", "debug=fast_dev_run", "model=mlp", "data.batch_size=32", "run_name=fdr"],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "train" / "fdr"
    assert final_metrics(run)["test/acc"] >= 0.0
    # The overrides reached the objects: the recorded config is what was asked for.
    cfg = (run / ".hydra" / "config.yaml").read_text()
    assert "batch_size: 32" in cfg and "fasttrain.models.nets.MLP" in cfg


@pytest.mark.slow  # tens of seconds: CI runs it in make test-slow
def test_precision_override_works_on_cpu(tmp_path: Path) -> None:
    proc = run_cli(["train.py", "debug=fast_dev_run", "trainer.precision=16-mixed"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bf16-mixed" in proc.stdout + proc.stderr  # Lightning says it fell back from fp16


TRAIN_CLI = [
    (["train.py", "trainer.max_epoch=3"], "max_epoch"),
    (["train.py", "trainer.max_epochs=ten"], "trainer.max_epochs='ten': expected int"),
    (["train.py", "data.batch_size=0"], "data.batch_size=0: expected an int >= 1"),
    (["train.py", "trainer.precision=17"], "trainer.precision=17: expected one of"),
    (["train.py", "+trainer.max_epoch=3"], "did you mean max_epochs"),
]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # ~12 s each (a process): train.py's messages are checked in process by
        # tests/test_bad_input.py, whose test_command_line runs train.py itself; CI runs these.
        *(pytest.param(args, expected, marks=pytest.mark.slow) for args, expected in TRAIN_CLI),
        (["-m", "fasttrain.evaluate"], "ckpt_path is required"),
        (
            ["-m", "fasttrain.evaluate", "ckpt_path=missing.ckpt"],
            "ckpt_path=missing.ckpt: no such file",
        ),
    ],
)
def test_bad_input_fails_clearly_and_writes_nothing(
    args: list[str], expected: str, tmp_path: Path
) -> None:
    proc = run_cli(args, tmp_path)
    assert proc.returncode != 0
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not tmp_path.exists() or not any(tmp_path.rglob("*")), (
        "a run that never started left files"
    )


def test_help_is_fast_because_torch_is_not_imported() -> None:
    code = (
        "import sys; sys.argv = ['train.py', '--help']\n"
        "from fasttrain.train import main; main()\n"
        "assert 'torch' not in sys.modules and 'lightning' not in sys.modules, 'heavy import'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data_sets = ", ".join(sorted(p.stem for p in (REPO / "conf" / "data").glob("*.yaml")))
    assert f"data: {data_sets}\n" in proc.stdout and "digits" in data_sets
    assert "_target_: fasttrain.models.Classifier" in proc.stdout


@pytest.mark.parametrize(
    "args", [["--cfg", "job"], ["--info"], ["experiment=cifar10_resnet18", "--cfg", "job"]]
)
def test_printing_the_config_imports_nothing_heavy(args: list[str], tmp_path: Path) -> None:
    # --cfg/--info print what Hydra composed: no torch, Lightning or scikit-learn (seconds).
    code = (
        f"import sys; sys.argv = ['train.py', 'paths.root_dir={tmp_path}', *{args!r}]\n"
        "try:\n"
        "    from fasttrain.train import main; main()\n"
        "finally:\n"
        "    print('HEAVY', [m for m in ('torch', 'lightning', 'sklearn') if m in sys.modules])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "HEAVY []" in proc.stdout and "_target_" in proc.stdout


def test_plain_command_from_an_empty_folder_puts_runs_under_its_logs(tmp_path: Path) -> None:
    # No paths.* override: the run dir is derived from the launch folder (${hydra:runtime.cwd}),
    # as with `make train`; the command-line check must resolve it the same way Hydra does.
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "debug=fast_dev_run", "run_name=plain"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "logs" / "train" / "plain" / "metrics.json").is_file()


def test_the_hydra_internals_a_single_run_uses_are_still_there() -> None:
    # fasttrain.cli runs a single run on the config its check composed (no second compose) with
    # the pieces Hydra.run and hydra.main use; a Hydra release that moves one fails here.
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import (
        create_automatic_config_search_path,
        detect_task_name,
        run_and_report,
    )
    from hydra.core.utils import configure_log, run_job

    assert callable(Hydra.create_main_hydra2) and callable(Callbacks)
    assert detect_task_name(None, "fasttrain.cli") == "cli"  # the job name @hydra.main gives
    for piece in (create_automatic_config_search_path, run_and_report, configure_log, run_job):
        assert callable(piece)


def test_a_single_run_is_composed_once(tmp_path: Path) -> None:
    from hydra._internal.hydra import Hydra

    from fasttrain.config.overrides import check_command_line

    calls: list[int] = []
    real = Hydra.compose_config

    def counted(self: Hydra, *args: object, **kwargs: object) -> object:
        calls.append(1)
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    Hydra.compose_config = counted  # type: ignore[method-assign]
    try:
        checked = check_command_line("train", [f"paths.log_dir={tmp_path}", "run_name=once"])
    finally:
        Hydra.compose_config = real  # type: ignore[method-assign]
    assert len(calls) == 1 and checked.run is not None and checked.hydra is not None
    assert checked.run.hydra.run.dir == str(checked.run_dir)  # the folder the run will use
    assert list(checked.run.hydra.overrides.hydra)[-1] == "hydra.mode=RUN"  # as Hydra records it
    assert not tmp_path.exists() or not any(tmp_path.iterdir())  # nothing written


def test_a_key_given_twice_names_the_run_by_the_value_used(tmp_path: Path) -> None:
    """Hydra runs with the last of two values for one key; the folder names that one only
    (it listed both, sorted: `seed=5 seed=3` ran with seed=3 and was named seed=3,seed=5)."""
    from fasttrain.config.overrides import check_command_line

    checked = check_command_line("train", [f"paths.log_dir={tmp_path}", "seed=5", "model=mlp",
                                           "seed=3", "data.batch_size=16"])  # fmt: skip
    assert checked.run is not None and checked.run.seed == 3
    assert re.fullmatch(r"data\.batch_size=16,model=mlp,seed=3_\d{4}-\d{6}",
                        Path(checked.run_dir).name)  # fmt: skip
    from fasttrain.config.resolvers import _last_of_each_key

    typed = ["model.net.hidden=[64,32]", "seed=1", "seed=1"]  # a value with commas; one repeat
    assert _last_of_each_key("model.net.hidden=[64,32],seed=1,seed=1", typed) == (
        "model.net.hidden=[64,32],seed=1"
    )
