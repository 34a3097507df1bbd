"""Round four from outside the suite: a checkpoint's spec slots admit only their own kind (no
logger or callback built from a checkpoint, whatever conf/ names), FASTTRAIN_ROOT set empty or
relative, and refusals that end the process at once whatever a library left running."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO

NET = {"_target_": "fasttrain.models.nets.mlp.MLP", "input_shape": [1, 8, 8], "num_classes": 10}
ADAMW = {"_target_": "torch.optim.adamw.AdamW", "_partial_": True, "lr": 0.003}
MLFLOW = "fasttrain.callbacks.mlflow_run.MLflowRun"  # named in conf/logger/mlflow.yaml


def crafted(tmp_path: Path, **hparams: object) -> Path:
    ckpt = tmp_path / "crafted.ckpt"
    torch.save({"state_dict": {}, "task_target": "fasttrain.models.Classifier",
                "hyper_parameters": {"net": NET, "optimizer": ADAMW, "num_classes": 10,
                                     **hparams}}, ckpt)  # fmt: skip
    return ckpt


@pytest.mark.parametrize("slot", ["scheduler", "net", "optimizer"])
def test_a_logger_named_in_conf_is_refused_in_every_spec_slot(slot: str, tmp_path: Path) -> None:
    """MLflowRun passes the name check (conf/ names it) but is no scheduler: refused before it
    is built, so the SQLite store it names is never made."""
    from fasttrain.checkpoints.load import load_task
    from fasttrain.config.errors import UserError

    store = tmp_path / "store" / "mlflow.db"
    spec = {"_target_": MLFLOW, "tracking_uri": f"sqlite:///{store}", "experiment_name": "x"}
    ckpt = crafted(tmp_path, **{slot: spec})
    with pytest.raises(UserError, match=rf"its {slot} names {MLFLOW}, which is not a"):
        load_task(ckpt)
    assert not (tmp_path / "store").exists()
    assert not list(tmp_path.rglob("*.lock")) and not (tmp_path / "mlruns").exists()


@pytest.mark.parametrize(
    ("slot", "target", "kind"),
    [
        ("net", "torch.optim.sgd.SGD", "Module"),  # allowed by its prefix, but an optimizer
        ("optimizer", "fasttrain.models.nets.mlp.MLP", "Optimizer"),
        ("scheduler", "torch.optim.adamw.AdamW", "LRScheduler or ReduceLROnPlateau"),
    ],
)
def test_each_slot_admits_only_its_own_kind(slot: str, target: str, kind: str,
                                            tmp_path: Path) -> None:  # fmt: skip
    from fasttrain.checkpoints.load import load_task
    from fasttrain.config.errors import UserError

    ckpt = crafted(tmp_path, **{slot: {"_target_": target}})
    with pytest.raises(UserError, match=rf"its {slot} names {target}, which is not a {kind}"):
        load_task(ckpt)


def test_a_target_outside_the_spec_slots_is_refused(tmp_path: Path) -> None:
    from fasttrain.checkpoints.load import load_task
    from fasttrain.config.errors import UserError

    ckpt = crafted(tmp_path, label_smoothing={"_target_": "torch.optim.adamw.AdamW"})
    with pytest.raises(UserError, match=r"its label_smoothing names .*holds plain values"):
        load_task(ckpt)


def test_a_data_slot_naming_a_logger_is_refused_before_it_is_built(tmp_path: Path) -> None:
    from fasttrain.checkpoints.load import load_task
    from fasttrain.config.errors import UserError

    ckpt = crafted(tmp_path)
    record = torch.load(ckpt, weights_only=True)
    record["datamodule_target"] = MLFLOW
    torch.save(record, ckpt)
    with pytest.raises(UserError, match=rf"its data names {MLFLOW}, which is not a "
                                        "LightningDataModule"):  # fmt: skip
        load_task(ckpt)


# ---- FASTTRAIN_ROOT ------------------------------------------------------------------------


def test_an_empty_root_is_read_as_unset_and_said_once(tmp_path: Path, monkeypatch,
                                                      capsys) -> None:  # fmt: skip
    from hydra import compose, initialize_config_dir

    from fasttrain.cli import check_root

    monkeypatch.setenv("FASTTRAIN_ROOT", "")
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose("train")
    assert cfg.paths.log_dir == f"{tmp_path}/logs"  # not /logs
    check_root()
    assert "FASTTRAIN_ROOT is set but empty: read as unset" in capsys.readouterr().err
    assert "FASTTRAIN_ROOT" not in os.environ  # DDP ranks and sweep jobs do not say it again


def test_a_relative_root_is_refused(monkeypatch) -> None:
    from fasttrain.cli import check_root
    from fasttrain.config.errors import UserError

    monkeypatch.setenv("FASTTRAIN_ROOT", "runs")
    with pytest.raises(UserError, match=r"FASTTRAIN_ROOT=runs: expected an absolute path"):
        check_root()


# ---- refusals end the process --------------------------------------------------------------

# A sitecustomize that leaves what keeps a normal exit waiting: a non-daemon thread and an
# atexit handler that never return (as a stuck uploader or pool would).
STUCK = """import atexit, threading, time
threading.Thread(target=time.sleep, args=(600,), name="stuck").start()
atexit.register(time.sleep, 600)
"""


def refuse(args: list[str], tmp_path: Path, timeout: float = 90) -> tuple[int, str, float]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(STUCK)
    # prepended: a generated project's tests import its package from PYTHONPATH
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("HYDRA_FULL_ERROR", None)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, *args, f"paths.log_dir={tmp_path / 'logs'}"],
                          cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    return proc.returncode, proc.stderr, time.monotonic() - start


def test_a_refusal_ends_the_process_whatever_is_left_running(tmp_path: Path) -> None:
    code, err, took = refuse(["-m", "fasttrain.evaluate", f"ckpt_path={tmp_path}/none.ckpt"],
                             tmp_path)  # fmt: skip
    assert code == 2, err[-2000:]
    assert err.strip().splitlines()[-1].startswith(f"error: ckpt_path={tmp_path}/none.ckpt")
    assert took < 60


@pytest.mark.slow  # five processes, ~1 min: CI runs it in make test-slow
@pytest.mark.parametrize(
    "args",
    [
        ["train.py", "model=gpt", "data=text", "data.block_size=0"],
        ["-m", "fasttrain.export", "ckpt_path=none.ckpt"],
        ["-m", "fasttrain.predict", "ckpt_path=none.ckpt"],
        ["-m", "fasttrain.prepare", "data=digits", "data.batch_size=0"],
        ["train.py", "trainer.max_epochs=-5"],
    ],
    ids=["train-built", "export", "predict", "prepare", "train-checked"],
)
def test_every_entry_points_refusal_ends_at_once(args: list[str], tmp_path: Path) -> None:
    code, err, took = refuse(args, tmp_path)
    assert code == 2, err[-2000:]
    assert err.strip().splitlines()[-1].startswith("error: ")
    assert took < 60


# ---- printed commands that work -------------------------------------------------------------


def test_a_net_its_checkpoints_could_not_name_is_refused_at_the_start(tmp_path: Path) -> None:
    """`model.net._target_=mypkg.nets.Wide` trained, then every printed evaluate/export/predict
    command was refused by the allowlist; now the run refuses first, saying how to admit it."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from fasttrain.checkpoints.allow import check_loadable, conf_targets
    from fasttrain.config.errors import UserError

    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        job = compose("train", overrides=["model/net=mlp"])
    check_loadable(job)  # the shipped classes load again
    with open_dict(job):
        job.model.net._target_ = "mypkg.nets.Wide"
    with pytest.raises(UserError, match=r"^model\.net\._target_=mypkg\.nets\.Wide: its "
                       r"checkpoints could not be loaded again .* conf/model/net/wide\.yaml "
                       r"holding `_target_: mypkg\.nets\.Wide`"):  # fmt: skip
        check_loadable(job)
    conf = tmp_path / "conf"
    (conf / "model" / "net").mkdir(parents=True)
    (conf / "model" / "net" / "wide.yaml").write_text("_target_: mypkg.nets.Wide\n")
    conf_targets.cache_clear()
    check_loadable(job, config_dir=str(conf))  # named in conf/: admitted


CASES = [
    ("tags=[héllo,b]", 'tags=["héllo","b"]'),
    ("prompt=é", 'prompt="é"'),
    ("run_name=a→b", 'run_name="a→b"'),
]


@pytest.mark.parametrize(("typed", "suggested"), CASES)
def test_non_ascii_in_an_override_is_shown_the_quoting_that_works(
    typed: str, suggested: str
) -> None:
    import shlex

    from fasttrain.config.errors import UserError
    from fasttrain.config.explain import bad_syntax
    from fasttrain.config.overrides import check_command_line

    config = "predict" if typed.startswith("prompt") else "train"
    with pytest.raises(UserError) as refused:
        check_command_line(config, [typed])
    message = str(refused.value)
    assert message.startswith(f"{typed}: not a valid override")
    assert message.endswith(f"quote the value as Hydra's grammar needs: {shlex.quote(suggested)}")
    (pasted,) = shlex.split(message.rsplit(": ", 1)[1])  # as a shell reads it
    assert bad_syntax([pasted]) is None  # the suggestion is valid Hydra
