"""Checkpoints written before the package took its current layout (tests/data/, an MLP on
digits with hidden=[16], 2 epochs) still load everywhere a checkpoint is read: the `_target_`s
they store (fasttrain.models.nets.mlp.MLP, torch optimizers and schedulers) still resolve."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from conftest import REPO, final_metrics, run_cli

OLD = REPO / "tests" / "data" / "mlp_before_layout.ckpt"
QUIET = ["data.num_workers=0"]


@pytest.fixture
def old_ckpt(tmp_path: Path) -> Path:
    net = torch.load(OLD, weights_only=True)["hyper_parameters"]["net"]["_target_"]
    if not (REPO / "src" / net.split(".")[0]).is_dir():
        # A project made from this template (make new-project) renamed the package; the
        # checkpoint, a binary file, still names the template's (which may still be importable
        # from another environment, yet is not a package of this project).
        pytest.skip(f"the checkpoint names {net}, a package this project does not have")
    # <run>/checkpoints/last.ckpt, as a run folder holds it (export writes beside it)
    target = tmp_path / "old_run" / "checkpoints" / "last.ckpt"
    target.parent.mkdir(parents=True)
    shutil.copy(OLD, target)
    return target


SLOW = pytest.mark.slow  # tens of seconds each: CI runs them in make test-slow


@pytest.mark.parametrize(
    "command",
    [pytest.param(c, marks=SLOW) for c in ("evaluate", "predict", "export")],
)
def test_old_checkpoint_loads_in_checkpoint_commands(
    command: str, old_ckpt: Path, tmp_path: Path
) -> None:
    extra = ["format=torchscript", "latency_time=0.01"] if command == "export" else []
    proc = run_cli(["-m", f"fasttrain.{command}", f"ckpt_path={old_ckpt}", *QUIET, *extra],
                   tmp_path / "logs")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    if command == "evaluate":
        (run,) = (tmp_path / "logs" / "eval").iterdir()
        assert final_metrics(run)["test/acc"] > 0.5  # the trained weights, not a fresh net


@pytest.mark.slow  # tens of seconds: CI runs it in make test-slow
def test_old_checkpoint_resumes_training(old_ckpt: Path, tmp_path: Path) -> None:
    args = ["train.py", "model=mlp", "model.net.hidden=[16]", f"resume={old_ckpt}",
            "trainer.max_epochs=3", "logger=none", "run_name=more", *QUIET]  # fmt: skip
    proc = run_cli(args, tmp_path / "logs")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "logs" / "train" / "more" / "checkpoints" / "last.ckpt").is_file()
