"""Every kind of bad input: one `error:` line naming the override and what is valid, exit code 2,
no traceback, and no run folder left behind.

Most cases run `fasttrain.train.main()` in this process (the same code path as the command line,
without a second of start-up per case); a few run the real command in a subprocess.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import REPO, run_cli

NPY = "data=npy"


@pytest.fixture(autouse=True)
def _fresh_log_streams():
    """In-process Hydra and Lightning runs leave handlers on the previous test's (now closed)
    captured stderr; point them at this test's."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            stream = getattr(handler, "stream", None)
            if isinstance(handler, logging.StreamHandler) and getattr(stream, "closed", False):
                handler.stream = sys.stderr  # setStream would flush the closed one


def write_npy(folder: Path, x: np.ndarray, y: np.ndarray) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", y)
    return f"data.path={folder}"


def npy_case(kind: str, tmp_path: Path) -> list[str]:
    """Overrides for data=npy with files broken in one way."""
    x = np.zeros((40, 1, 8, 8), np.float32)
    y = np.arange(40) % 10
    folder = tmp_path / "npy"
    if kind == "missing":
        return [NPY, f"data.path={tmp_path / 'nowhere'}"]
    if kind == "shape":
        return [NPY, write_npy(folder, np.zeros((40, 3, 4, 4), np.float32), y)]
    if kind == "dtype":
        return [NPY, write_npy(folder, x, y.astype(np.float32))]
    if kind == "x_dtype":
        return [NPY, write_npy(folder, x.astype(np.complex64), y)]
    if kind == "labels":
        return [NPY, write_npy(folder, x, y + 3)]  # labels up to 12 with 10 classes
    if kind == "length":
        return [NPY, write_npy(folder, x, y[:30])]
    if kind == "corrupt":
        folder.mkdir(parents=True)
        (folder / "x.npy").write_bytes(b"not an array")
        np.save(folder / "y.npy", y)
        return [NPY, f"data.path={folder}"]
    raise ValueError(kind)


def other_model_checkpoint(tmp_path: Path, **training_state: object) -> str:
    """A Classifier checkpoint of the CNN (the default is model=cnn; the cases pass model=mlp),
    its weights alone or with `training_state` (epoch, loops, ...)."""
    from hydra import compose, initialize_config_dir

    from conftest import CONF
    from fasttrain.assemble import build

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["model=cnn"])
    model = build(cfg.model, "model")
    path = tmp_path / "cnn.ckpt"
    weights = {"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}
    torch.save({**weights, **training_state}, path)
    return str(path)


# A checkpoint of the right model whose training state is damaged: its loops a string.
DAMAGED = {"epoch": 0, "global_step": 3, "loops": "garbage", "optimizer_states": [],
           "lr_schedulers": [], "callbacks": {}}  # fmt: skip


def garbage_file(tmp_path: Path) -> str:
    path = tmp_path / "garbage.ckpt"
    path.write_bytes(b"\x00not a checkpoint")
    return str(path)


# (overrides, substrings the error line must hold: the override, then what is valid)
CASES = [
    # unknown keys and options, with did-you-mean
    (["trainer.max_epoch=3"], ["trainer.max_epoch=3", "did you mean trainer.max_epochs"]),
    (["model.net.chanels=[8]"], ["model.net.chanels", "did you mean model.net.channels"]),
    (["seedd=1"], ["seedd=1", "did you mean seed"]),
    (["ckpt_path=x.ckpt"], ["ckpt_path", "resume=PATH"]),
    (["trainer=foo"], ["trainer=foo", "valid: cpu", "ddp_cpu", "gpu"]),
    (["model/net=mlpp"], ["model/net=mlpp", "did you mean mlp", "small_cnn"]),
    (["logger=tensorbord"], ["logger=tensorbord", "did you mean tensorboard"]),
    (["experiment=nope"], ["experiment=nope", "digits_cnn", "digits_mlp"]),
    (["+trainer.max_epochs=3"], ["trainer.max_epochs", "without the +"]),
    (["+trainer.max_steps=200"], ["trainer.max_steps", "without the +"]),
    (["trainer.max_stpes=200"], ["trainer.max_stpes=200", "did you mean trainer.max_steps"]),
    (["trainer.max_steps=ten"], ["trainer.max_steps='ten'", "int"]),
    (["trainer.max_epochs=[1,"], ["trainer.max_epochs=[1,", "not a valid override"]),
    # wrong types and choices
    (["data.batch_size=abc"], ["data.batch_size='abc'", "expected int"]),
    (["trainer.max_epochs=ten"], ["trainer.max_epochs='ten'", "int"]),
    (["trainer.precision=17"], ["trainer.precision=17", "'16-mixed'", "'bf16-mixed'"]),
    (["model.scheduler_interval=hourly"], ["model.scheduler_interval", "'epoch', 'step'"]),
    (["model.net.init=zeros"], ["model.net.init='zeros'", "'kaiming'"]),
    # out-of-range numbers
    (["data.batch_size=0"], ["data.batch_size=0", ">= 1"]),
    (["data.batch_size=-8"], ["data.batch_size=-8", ">= 1"]),
    (["model.optimizer.lr=-0.1"], ["model.optimizer.lr=-0.1", "> 0"]),
    (["model.optimizer.lr=0"], ["model.optimizer.lr=0", "> 0"]),
    (["model/optimizer=sgd", "model.optimizer.momentum=-1"], ["model.optimizer.momentum=-1"]),
    (["trainer.max_epochs=-5"], ["max_epochs", "non-negative integer or -1"]),
    # 0 trained nothing, then tested the untrained model as the run's result
    (["trainer.max_epochs=0"], ["trainer.max_epochs=0", "no training batch", ">= 1"]),
    (["trainer.max_steps=0"], ["trainer.max_steps=0", "no training batch", "train=false"]),
    (["data.val_fraction=1.5"], ["data.val_fraction=1.5", "between 0 and 1"]),
    (["data.val_fraction=0"], ["data.val_fraction=0", "between 0 and 1"]),
    (["data.test_fraction=-0.2"], ["data.test_fraction=-0.2", "between 0 and 1"]),
    (["data.num_workers=-1"], ["data.num_workers=-1", "from 0 to"]),
    (["model.net.dropout=1.5"], ["model.net.dropout=1.5", "[0, 1)"]),
    (["callbacks.checkpoint.every_n_train_steps=-2"], ["callbacks.checkpoint", "Must be >= 0"]),
    # an int 0 divided Lightning's step count mid-fit; one past the epoch failed when fit read
    # the loader (both a traceback, after the run folder was written)
    (["trainer.val_check_interval=0"], ["trainer.val_check_interval=0", "an int >= 1"]),
    (["trainer.check_val_every_n_epoch=0"], ["trainer.check_val_every_n_epoch=0", ">= 1 or null"]),
    (["trainer.log_every_n_steps=0"], ["trainer.log_every_n_steps=0", "an int >= 1"]),
    # Lightning's TypeError traceback (devices), or a run that took them (the others)
    (["trainer.devices=-3"], ["trainer.devices=-3", ">= -1 (-1: every device)"]),
    (["trainer.min_epochs=-1"], ["trainer.min_epochs=-1", "an int >= 0 or null"]),
    (["+trainer.num_sanity_val_steps=-5"], ["trainer.num_sanity_val_steps=-5", ">= -1"]),
    (["+trainer.num_nodes=0"], ["trainer.num_nodes=0", "an int >= 1"]),
    (
        ["trainer.val_check_interval=1000"],
        ["trainer.val_check_interval=1000", "at most 19", "check_val_every_n_epoch=null"],
    ),
    # a monitor's mode kept the worst weights as the best; a monitor never logged was a
    # traceback from inside fit
    (
        ["callbacks.best.monitor=val/loss"],
        ["callbacks.best.mode=max", "val/loss is better lower", "set callbacks.best.mode=min"],
    ),
    (
        ["model=regressor", "data=diabetes", "callbacks.best.monitor=val/r2"],
        ["callbacks.best.mode=min", "val/r2 is better higher", "set callbacks.best.mode=max"],
    ),
    # a sweep's misspelt metric was found when the run ended: each job trained in full first
    (
        ["optimized_metric=val/nope", "trainer.limit_train_batches=2"],
        ["optimized_metric='val/nope'", "its validation logs val/acc, val/acc_best, val/loss"],
    ),
    (
        ["callbacks.best.monitor=val/nope"],
        ["callbacks.best.monitor=val/nope", "the run logs no val/nope", "val/acc, val/acc_best"],
    ),
    # labels outside the class range
    (["data.num_classes=5"], ["data.num_classes=5", "expected an int >= 10"]),
    # paths and checkpoints
    (["resume=missing.ckpt"], ["resume=missing.ckpt", "no such file", "never, auto"]),
    (["resume={garbage}"], ["resume=", "not a readable checkpoint"]),
    (["model=mlp", "resume={other_model}"], ["resume=", "different model", "resume=never"]),
    # weights without the training state, or a damaged one: a TypeError deep inside fit
    (["resume={other_model}"], ["resume=", "continue from (epoch: missing)", "resume=never"]),
    (["resume={damaged}"], ["resume=", "continue from (loops: str garbage)", "resume=never"]),
    # data files: missing, unreadable, wrong shape, wrong dtype, bad labels
    (["{npy:missing}"], ["data.path=", "no x.npy", "y.npy"]),
    (["{npy:corrupt}"], ["data.path=", "x.npy is not readable"]),
    (["{npy:shape}"], ["data.input_shape=[1, 8, 8]", "shape [3, 4, 4]"]),
    (["{npy:dtype}"], ["data.path=", "y.npy holds float32", "integer labels"]),
    (["{npy:x_dtype}"], ["data.path=", "complex64", "float or uint8"]),
    (["{npy:length}"], ["data.path=", "40 samples, y.npy 30"]),
    (["{npy:labels}"], ["data.num_classes=10", "labels span 3..12", "0..9"]),
]


def expand(overrides: list[str], tmp_path: Path) -> list[str]:
    out: list[str] = []
    for o in overrides:
        if o.startswith("{npy:"):
            out += npy_case(o[5:-1], tmp_path)
        elif "{garbage}" in o:
            out.append(o.replace("{garbage}", garbage_file(tmp_path)))
        elif "{damaged}" in o:
            out.append(o.replace("{damaged}", other_model_checkpoint(tmp_path, **DAMAGED)))
        elif "{other_model}" in o:
            out.append(o.replace("{other_model}", other_model_checkpoint(tmp_path)))
        else:
            out.append(o)
    return out


def assert_one_error_line(lines: list[str], expected: list[str]) -> None:
    """One `error:` line, the last thing printed, holding each expected part; no traceback."""
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines[-5:]
    assert not any("Traceback" in line for line in lines), lines
    for part in expected:
        assert part in errors[0], (part, errors[0])


def assert_nothing_written(log_dir: Path) -> None:
    left = (
        sorted(str(p.relative_to(log_dir)) for p in log_dir.rglob("*")) if log_dir.exists() else []
    )
    assert not [p for p in left if p not in ("train",)], f"left behind: {left}"


def refused(argv: list[str], monkeypatch, capsys) -> list[str]:
    """What `python train.py *argv` printed on stderr, refused with exit code 2."""
    from fasttrain.train import main

    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2, err
    return err


@pytest.mark.parametrize(("overrides", "expected"), CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_is_one_line_exit_2_nothing_written(
    overrides: list[str], expected: list[str], tmp_path: Path, monkeypatch, capsys
) -> None:

    log_dir = tmp_path / "logs"
    argv = ["data.num_workers=0", *expand(overrides, tmp_path), f"paths.log_dir={log_dir}"]
    err = refused(argv, monkeypatch, capsys)
    assert_one_error_line(err, expected)
    assert not [line for line in err if "on_exception.ckpt" in line], err  # a taken-back file
    assert_nothing_written(log_dir)


def test_the_trainers_length_knobs_are_plain_overrides() -> None:
    # `trainer.max_steps=200` was refused (did you mean trainer.max_epochs?); only the +form ran
    from fasttrain.config.overrides import check_command_line

    knobs = ["trainer.max_steps=200", "trainer.min_steps=10", "trainer.max_time=00:00:10:00",
             "trainer.limit_train_batches=0.5", "trainer.limit_val_batches=3",
             "trainer.limit_test_batches=2", "trainer.val_check_interval=0.25"]  # fmt: skip
    (job,) = check_command_line("train", knobs).jobs
    assert job.trainer.max_steps == 200 and job.trainer.max_time == "00:00:10:00"
    assert job.trainer.limit_train_batches == 0.5 and job.trainer.val_check_interval == 0.25


# The real command line for a few: an error before Hydra starts, one while building, and the
# switch that shows the traceback.
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["data.batch_size=0"], "data.batch_size=0: expected an int >= 1"),
        pytest.param(["trainer=fo"], "trainer=fo: no such option", marks=pytest.mark.slow),
    ],
)
def test_command_line(overrides: list[str], expected: str, tmp_path: Path) -> None:
    proc = run_cli([str(REPO / "train.py"), *overrides], tmp_path / "logs")
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr.strip().splitlines(), [expected])
    assert_nothing_written(tmp_path / "logs")


@pytest.mark.parametrize("override", ["trainer.max_epoch=3", "data.batch_size=0"])
def test_hydra_full_error_lets_the_exception_through(override: str, tmp_path: Path, monkeypatch):
    """HYDRA_FULL_ERROR=1: the exception propagates (Python prints its traceback), before Hydra
    starts and inside the run alike."""
    from fasttrain.config.errors import UserError
    from fasttrain.train import main

    argv = ["train.py", override, f"paths.log_dir={tmp_path}"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(UserError, match=override.split("=")[0]):
        main()


def test_a_monitor_of_its_own_names_the_best_checkpoint_by_its_value(tmp_path: Path) -> None:
    """callbacks.best's file name shows the value it keeps the best of (it showed the task's
    monitor, val/acc, whatever callbacks.best.monitor said), and the direction of each metric
    comes from the task: its name, its monitor_mode, its torchmetrics' higher_is_better."""
    from practices import compose_train

    from fasttrain.assemble.monitors import direction
    from fasttrain.models.classifier import Classifier

    own = compose_train(tmp_path, "callbacks.best.monitor=val/loss", "callbacks.best.mode=min",
                        quick=False)  # fmt: skip
    assert own.callbacks.best.filename == "epoch{epoch:03d}-loss{val/loss:.4f}"
    default = compose_train(tmp_path, quick=False).callbacks.best.filename
    assert default == "epoch{epoch:03d}-acc{val/acc:.4f}"
    # no monitor (the newest kept): still named by the task's metric, as logged
    unwatched = compose_train(tmp_path, "callbacks.best.monitor=null", quick=False)
    assert unwatched.callbacks.best.filename == default
    task = Classifier.__new__(Classifier)  # the class's own answers, no net needed
    task.num_classes = 3
    assert [direction(task, n) for n in ("val/loss", "val/acc", "val/acc_best", "test/acc")] == [
        "min",
        "max",
        "max",
        "max",
    ]
    assert direction(task, "val/f9") is None  # a name the task does not know: not checked


@pytest.mark.parametrize(
    "data", [[], ["data=text", "model=gpt", "data.path={text}", "data.cache_dir={cache}"]]
)
def test_a_worker_count_past_any_machine_is_refused_before_it_forks(
    data: list[str], tmp_path: Path, monkeypatch, capsys
) -> None:
    """data.num_workers=100000 forked worker after worker until the machine gave out (the run
    folder left behind), for an in-memory data set as for a decoded one."""
    from fasttrain.config.domains import check_arguments
    from fasttrain.data.base import TensorDataModule, max_workers

    check_arguments(TensorDataModule.__init__, {"num_workers": max_workers()})  # the most: taken
    text = tmp_path / "corpus.txt"
    text.write_text("a few words of text, again and again. " * 200)
    log_dir = tmp_path / "logs"
    too_many = max_workers() + 1
    chosen = [o.replace("{text}", str(text)).replace("{cache}", str(tmp_path)) for o in data]
    argv = [*chosen, f"data.num_workers={too_many}", f"paths.log_dir={log_dir}"]
    err = refused(argv, monkeypatch, capsys)
    assert_one_error_line(err, [f"data.num_workers={too_many}", f"to {max_workers()}"])
    assert_nothing_written(log_dir)


@pytest.mark.skipif(np.dtype(np.longdouble).itemsize <= 8, reason="long double is float64 here")
def test_a_long_double_x_npy_is_refused_in_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """float128 passed the dtype check (a float) and torch failed to convert it, a traceback."""

    x = np.zeros((40, 1, 8, 8), np.longdouble)
    log_dir = tmp_path / "logs"
    argv = [NPY, write_npy(tmp_path / "npy", x, np.arange(40) % 10), f"paths.log_dir={log_dir}"]
    err = refused(["data.num_workers=0", "model=mlp", *argv], monkeypatch, capsys)
    assert_one_error_line(err, ["data.path=", f"x.npy holds {x.dtype}", "float32"])
    assert_nothing_written(log_dir)
