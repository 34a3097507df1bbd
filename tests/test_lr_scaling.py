"""model.lr_scaling scales the optimizer's lr by effective batch / base_batch_size, and logs both;
tuner.lr_find / tuner.batch_size run Lightning's tuner before fit."""

from __future__ import annotations

import math
from pathlib import Path

import lightning as L
import pytest
from practices import build_run, compose_train

from conftest import scalars
from fasttrain.models.classifier import scale_lr
from fasttrain.tasks import tuner
from fasttrain.tasks.tuner import tune

CPU = ["trainer.accelerator=cpu", "trainer.devices=1"]


@pytest.mark.parametrize(("rule", "expected"), [("none", 0.1), ("linear", 0.4), ("sqrt", 0.2)])
def test_scale_lr_arithmetic(rule: str, expected: float) -> None:
    assert scale_lr(0.1, effective_batch=256, base_batch=64, rule=rule) == pytest.approx(expected)
    assert scale_lr(0.1, 64, 64, rule) == pytest.approx(0.1)


LR_LOGGER = "fasttrain.callbacks.board.LearningRate"


class FirstLr(L.Callback):
    def on_train_start(self, trainer, pl_module) -> None:
        self.lr = trainer.optimizers[0].param_groups[0]["lr"]


@pytest.mark.parametrize("rule", ["linear", "sqrt"])
def test_optimizer_lr_scaled_by_effective_batch_and_logged(tmp_path: Path, rule: str) -> None:
    # effective batch = 32 x 4 (accumulation) x 1 (world) = 128 = 2 x base 64
    cfg = compose_train(tmp_path, *CPU, f"model.lr_scaling={rule}", "model.base_batch_size=64",
                        "data.batch_size=32", "trainer.accumulate_grad_batches=4",
                        "logger=tensorboard", "model.optimizer.lr=0.001",
                        f"+callbacks.lr_monitor._target_={LR_LOGGER}")  # fmt: skip
    first = FirstLr()
    trainer, model, datamodule = build_run(cfg, callbacks=[first])
    trainer.fit(model, datamodule=datamodule)
    expected = 0.001 * (2 if rule == "linear" else math.sqrt(2))
    assert first.lr == pytest.approx(expected)
    assert model.effective_batch_size == 128  # an HPARAMS column of the run
    tags = scalars(tmp_path / "run")
    assert tags["lr"][0] == pytest.approx(expected)  # the scaled lr at step 0, one lr series
    assert not any(t.startswith("lr/") or t.startswith("lr-") for t in tags)


def test_lr_find_sets_the_lr_used_for_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The range test needs a few dozen steps within the one epoch it may run. Whether its
    # suggestion is credible is tests/test_truth_runs.py's business: here it is taken.
    monkeypatch.setattr(tuner, "credible_lr", lambda lrs, losses, lr, configured: (lr, "taken"))
    cfg = compose_train(tmp_path, *CPU, "model.optimizer.lr=0.123", "data.batch_size=16",
                        "trainer.limit_train_batches=40")  # fmt: skip
    first = FirstLr()
    trainer, model, datamodule = build_run(cfg, callbacks=[first])
    tune(trainer, model, datamodule, lr_find=True)
    assert model.lr is not None and model.lr != 0.123
    trainer.fit(model, datamodule=datamodule)
    assert first.lr == pytest.approx(model.lr)


@pytest.mark.parametrize(
    ("overrides", "asked"),
    [([], None), (["tuner.lr_find=true"], {"lr_find": True, "batch_size": None}),
     (["tuner.batch_size=binsearch"], {"lr_find": False, "batch_size": "binsearch"})],
)  # fmt: skip
def test_the_training_task_runs_the_tuner_its_config_sets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: list[str], asked: dict | None
) -> None:
    from fasttrain.tasks import train

    calls: list[dict] = []
    monkeypatch.setattr(tuner, "tune", lambda trainer, model, data, **knobs: calls.append(knobs))
    train(compose_train(tmp_path, *CPU, "logger=none", *overrides))
    assert calls == ([asked] if asked else [])


@pytest.mark.slow
def test_batch_size_finder_changes_batch_size(tmp_path: Path) -> None:
    cfg = compose_train(tmp_path, *CPU, "data.batch_size=2")
    trainer, model, datamodule = build_run(cfg)
    tune(trainer, model, datamodule, batch_size="power")
    assert datamodule.batch_size > 2
