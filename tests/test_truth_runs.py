"""Runs that used to go wrong silently now refuse, stop or say what they did: fast_dev_run leaves
nothing to resume, 16-true with Adam and the one-process tools under DDP are refused, a run that
skips every step stops, the tuner's choices are checked, a GPU trainer without a GPU is named."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from practices import build_run, compose_train

from conftest import run_cli, run_dirs
from fasttrain.callbacks.grad_health import NonFiniteGradientError
from fasttrain.config.errors import ConfigError, UserError
from fasttrain.config.settings import check_precision_and_processes
from fasttrain.models.nets import MLP
from fasttrain.tasks.tuner import credible_lr, tune

TINY = ["model=mlp", "logger=none", "data.num_workers=0"]


@pytest.mark.slow  # tens of seconds: CI runs it in make test-slow
def test_fast_dev_run_leaves_no_checkpoint_a_real_run_would_resume(tmp_path: Path) -> None:
    debug = run_cli(["train.py", *TINY, "debug=fast_dev_run", "run_name=same"], tmp_path)
    assert debug.returncode == 0, debug.stderr[-3000:]
    assert not list(tmp_path.rglob("*.ckpt"))
    real = run_cli(["train.py", *TINY, "run_name=same", "trainer.max_epochs=1",
                    "trainer.limit_train_batches=3", "test=false"], tmp_path)  # fmt: skip
    assert real.returncode == 0, real.stderr[-3000:]
    assert "Restoring states" not in real.stdout + real.stderr  # trained from scratch
    assert (tmp_path / "train" / "same" / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["trainer.precision=16-true"], "error: trainer.precision=16-true: AdamW with eps=1e-08 "),
        (["trainer=ddp_cpu", "tuner.batch_size=power"],
         "error: tuner.batch_size=power: the batch-size finder runs in one process"),
        (["trainer=ddp_cpu", "oom_fallback=true"],
         "error: oom_fallback=true works in one process only, not under trainer.strategy=ddp"),
        (["trainer=ddp"], "error: trainer.accelerator='gpu': needs a GPU and none is visible"),
    ],
    ids=["16-true-adamw", "batch-finder-ddp", "oom-fallback-ddp", "ddp-without-gpu"],
)  # fmt: skip
def test_combinations_that_cannot_work_are_one_line_exit_2(
    args: list[str], message: str, tmp_path: Path
) -> None:
    proc = run_cli(["train.py", *TINY, *args], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith(message) and len(proc.stderr.strip().splitlines()) == 1
    assert run_dirs(tmp_path) == [] and not list(tmp_path.rglob("*.ckpt"))


def test_the_cross_key_check_says_what_works() -> None:
    adamw = {"optimizer": {"_target_": "torch.optim.AdamW", "lr": 1e-3}}
    works = r"use trainer\.precision=16-mixed .*bf16-mixed or bf16-true"
    with pytest.raises(UserError, match=works):
        check_precision_and_processes({"precision": "16-true"}, adamw, {}, False)
    # What the message offers, and what never divided by a zero eps, passes.
    for precision in ("16-mixed", "bf16-true", "bf16-mixed", "32-true"):
        check_precision_and_processes({"precision": precision}, adamw, {}, False)
    sgd = {"optimizer": {"_target_": "torch.optim.SGD", "lr": 0.1}}
    check_precision_and_processes({"precision": "16-true"}, sgd, {}, False)
    big_eps = {"optimizer": {**adamw["optimizer"], "eps": 1e-4}}
    check_precision_and_processes({"precision": "16-true"}, big_eps, {}, False)
    # dp is one process; ddp on one device is still the multi-process launcher.
    check_precision_and_processes({"strategy": "dp", "devices": 2}, None, {"batch_size": "power"},
                                  True)  # fmt: skip
    with pytest.raises(UserError, match="oom_fallback=true works in one process only"):
        check_precision_and_processes({"strategy": "auto", "num_nodes": 2}, None, {}, True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here")
@pytest.mark.parametrize("accelerator", ["gpu", "cuda"])
def test_a_gpu_trainer_without_a_gpu_points_to_the_cpu_ones(accelerator: str) -> None:
    from fasttrain.assemble import Trainer

    with pytest.raises(ConfigError, match="use trainer=cpu, or trainer=ddp_cpu") as err:
        Trainer(accelerator=accelerator, devices=1, logger=False)
    assert "\n" not in str(err.value)


class AlwaysNaN(MLP):
    """NaN logits on every training forward: every gradient is NaN."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)
        return out * float("nan") if self.training else out


@pytest.mark.parametrize("fused", [False, True], ids=["unfused_every_step", "fused_at_checks"])
def test_skipping_every_step_stops_the_run(fused: bool, tmp_path: Path) -> None:
    cfg = compose_train(
        tmp_path, "trainer.accelerator=cpu", "trainer.devices=1",
        "+callbacks@callbacks.nonfinite=none",
        "+callbacks.nonfinite._target_=fasttrain.callbacks.grad_health.NonFiniteGuard",
        "+callbacks.nonfinite.action=skip", "+callbacks.nonfinite.max_consecutive_skips=3",
        "trainer.limit_train_batches=12", "trainer.limit_val_batches=0",
        "trainer.log_every_n_steps=5", f"model.optimizer.fused={str(fused).lower()}",
    )  # fmt: skip
    trainer, model, datamodule = build_run(cfg, net=AlwaysNaN([1, 8, 8], 10, hidden=[16]))
    with (
        pytest.warns(UserWarning, match="optimizer step"),
        pytest.raises(NonFiniteGradientError, match=r"\d+ optimizer steps in a row skipped"),
    ):
        trainer.fit(model, datamodule=datamodule)
    # Unfused, the verdict is read every step: it stops at the 3rd. Fused, on the device, it is
    # read on logging steps (every 5): it stops at the first one after the 3rd, step 5.
    assert trainer.global_step == (5 if fused else 2)


def test_a_bad_max_consecutive_skips_is_named() -> None:
    from fasttrain.callbacks.grad_health import NonFiniteGuard

    with pytest.raises(ConfigError, match="max_consecutive_skips"):
        NonFiniteGuard("skip", max_consecutive_skips=0)


LRS = [10 ** (-6 + 6 * i / 49) for i in range(50)]  # 1e-6 .. 1, log-spaced, as the finder scans


def falling_then_diverging(knee: float) -> list[float]:
    """Flat, then falling from 1e-4 to `knee`, then diverging (a typical range test)."""
    return [2.3 if lr < 1e-4 else 2.3 - (0.3 if lr < knee else 1.5) if lr < 0.3 else 9.0
            for lr in LRS]  # fmt: skip


def test_credible_lr_accepts_a_suggestion_inside_a_falling_curve() -> None:
    lr, why = credible_lr(LRS, falling_then_diverging(1e-2), 3e-3, 1e-3)
    assert lr == 3e-3 and why.startswith("lr 0.003 (steepest loss descent")


@pytest.mark.parametrize(
    ("losses", "suggestion", "configured", "reason"),
    [
        (falling_then_diverging(1e-2), 1.5e-6, 1e-3, "at the edge of the scanned range"),
        ([2.3] * 50, 1e-3, 1e-3, "the loss hardly fell"),
        (falling_then_diverging(1e-2), 1e-5 * 2, 3e-3, "over 100x below the configured lr"),
        (falling_then_diverging(1e-2), None, 1e-3, "gave no suggestion"),
    ],
    ids=["edge", "flat", "far-below", "none"],
)
def test_credible_lr_keeps_the_configured_lr_otherwise(
    losses: list[float], suggestion: float | None, configured: float, reason: str
) -> None:
    lr, why = credible_lr(LRS, losses, suggestion, configured)
    assert lr is None and reason in why and f"keeping the configured lr {configured:g}" in why


def test_far_below_is_accepted_when_the_configured_lr_diverged() -> None:
    # The configured lr (0.5) lies where the curve blew up: a much smaller lr is the fix.
    lr, _ = credible_lr(LRS, falling_then_diverging(1e-2), 2e-3, 0.5)
    assert lr == 2e-3


def test_lr_find_says_what_it_chose(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = compose_train(tmp_path, "trainer.accelerator=cpu", "trainer.devices=1",
                        "data.batch_size=16", "trainer.limit_train_batches=40")  # fmt: skip
    trainer, model, datamodule = build_run(cfg)
    with caplog.at_level(logging.INFO, logger="fasttrain.tasks.tuner"):
        tune(trainer, model, datamodule, lr_find=True)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tuner.lr_find")]
    assert ("keeping the configured lr" in line) == (model.lr is None), line


def test_batch_size_finder_stops_at_the_training_split(tmp_path: Path) -> None:
    cfg = compose_train(
        tmp_path, "trainer.accelerator=cpu", "trainer.devices=1", "data=synthetic",
        "data.num_samples=40", "data.input_shape=[1,8,8]", "data.batch_size=2",
        "model.net.input_shape=[1,8,8]",
    )  # fmt: skip
    trainer, model, datamodule = build_run(cfg)
    tune(trainer, model, datamodule, batch_size="power")
    n_train = len(datamodule.splits["train"])
    assert n_train == 32 and 2 < datamodule.batch_size <= n_train
