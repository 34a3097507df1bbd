"""Resuming with other settings than the checkpoint's: a mid-epoch position counted in another
batch size is refused in one line (it used to skip the wrong samples, or the whole epoch), and
a run made longer re-plans its lr schedule at the same position (it used to keep the old
length: lr 0, then up again)."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from practices import build_run, compose_train

from fasttrain import fit
from fasttrain.config.errors import UserError
from fasttrain.data.resumable import ResumableLoader

LR = 0.003  # conf/model/optimizer/adamw.yaml


class LrAtBatch(Callback):
    """The lr of every training batch, by global step."""

    def __init__(self) -> None:
        self.lr: dict[int, float] = {}

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        self.lr[trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]


class SaveAt(Callback):
    """Save a checkpoint after optimizer step `step`, where ModelCheckpoint would save."""

    def __init__(self, step: int, path: Path) -> None:
        self.step, self.path = step, path

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def run(tmp_path: Path, *overrides: str, ckpt: Path | None = None, save: Path | None = None,
        save_at: int | None = None, quick: bool = True) -> tuple[Any, LrAtBatch]:  # fmt: skip
    """Fit (from `ckpt`) in this process; save to `save` after step `save_at`, or at the end."""
    lrs = LrAtBatch()
    saver = [SaveAt(save_at, save)] if save and save_at else []
    cfg = compose_train(tmp_path, *overrides, quick=quick)
    trainer, model, datamodule = build_run(cfg, [lrs, *saver])
    fit.fit(trainer, model, datamodule, str(ckpt) if ckpt else None)
    if save and not save_at:
        trainer.save_checkpoint(save)
    return trainer, lrs


# --- batch size --------------------------------------------------------------------------------
BATCHES = ["trainer.limit_train_batches=12", "trainer.limit_val_batches=0"]


def test_mid_epoch_resume_with_another_batch_size_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "mid.ckpt"
    run(tmp_path, *BATCHES, "data.batch_size=16", save=ckpt, save_at=5)
    with pytest.raises(UserError) as err:
        run(tmp_path, *BATCHES, "data.batch_size=64", ckpt=ckpt)
    assert str(err.value).startswith(
        "data.batch_size=64: the checkpoint stopped mid-epoch after 5 batches of 16"
    )
    assert "resume with data.batch_size=16" in str(err.value)


def test_mid_epoch_resume_with_the_same_batch_size_goes_on(tmp_path: Path) -> None:
    # Control for the test above: the same checkpoint resumes and finishes the epoch.
    ckpt = tmp_path / "mid.ckpt"
    run(tmp_path, *BATCHES, "data.batch_size=16", save=ckpt, save_at=5)
    trainer, lrs = run(tmp_path, *BATCHES, "data.batch_size=16", ckpt=ckpt)
    assert sorted(lrs.lr) == list(range(5, 12))
    assert trainer.global_step == 12


def test_the_loader_state_records_its_batch_size() -> None:
    data = torch.utils.data.TensorDataset(torch.arange(100.0))
    loader = ResumableLoader(data, seed=0, batch_size=10)
    batches = iter(loader)
    next(batches), next(batches)
    assert loader.state_dict() == {"epoch": 0, "batches": 2, "batch_size": 10}
    bigger = ResumableLoader(data, seed=0, batch_size=20)
    with pytest.raises(UserError, match=r"data\.batch_size=20: .* 2 batches of 10"):
        bigger.load_state_dict(loader.state_dict())
    bigger.load_state_dict({"epoch": 0, "batches": 0, "batch_size": 10})  # at an epoch start
    same = ResumableLoader(data, seed=0, batch_size=10)
    same.load_state_dict({"epoch": 0, "batches": 2})  # older checkpoints: no batch size
    assert len(list(same)) == 8


# --- lr schedule -------------------------------------------------------------------------------
# The cosine of conf/model/scheduler/cosine.yaml, no quick preset: its scheduler=null is the
# one thing these tests need.
SCHEDULED = ["model=mlp", "data.num_workers=0", "callbacks=none", "logger=none",
             "trainer.limit_train_batches=3", "trainer.limit_val_batches=0",
             "+trainer.enable_progress_bar=false", "+trainer.enable_model_summary=false",
             "+trainer.enable_checkpointing=false", "test=false"]  # fmt: skip


def cosine(position: int, length: int) -> float:
    return LR * (1 + math.cos(math.pi * position / length)) / 2


def test_a_run_made_longer_goes_on_along_a_cosine_of_the_new_length(tmp_path, caplog) -> None:
    ckpt = tmp_path / "one_epoch.ckpt"
    _, first = run(tmp_path, *SCHEDULED, "trainer.max_epochs=1", save=ckpt, quick=False)
    assert set(first.lr.values()) == {LR}
    with caplog.at_level("INFO"):
        _, longer = run(tmp_path, *SCHEDULED, "trainer.max_epochs=3", ckpt=ckpt, quick=False)
    # 3 batches per epoch; epoch 1 starts at step 3, epoch 2 at step 6
    assert longer.lr[3] == pytest.approx(cosine(1, 3)) and longer.lr[3] > 0
    assert longer.lr[6] == pytest.approx(cosine(2, 3))
    assert any("re-planned" in r.getMessage() and "T_max=1 -> T_max=3" in r.getMessage()
               for r in caplog.records)  # fmt: skip


def test_a_step_schedule_follows_max_steps_and_its_extension(tmp_path: Path) -> None:
    steps = ["model.scheduler_interval=step", "trainer.max_epochs=-1"]
    ckpt = tmp_path / "six_steps.ckpt"
    _, first = run(tmp_path, *SCHEDULED, *steps, "trainer.max_steps=6", save=ckpt, quick=False)
    assert [first.lr[s] for s in range(6)] == pytest.approx([cosine(s, 6) for s in range(6)])
    _, longer = run(tmp_path, *SCHEDULED, *steps, "trainer.max_steps=12", ckpt=ckpt,
                    quick=False)  # fmt: skip
    assert [longer.lr[s] for s in range(6, 12)] == pytest.approx(
        [cosine(s, 12) for s in range(6, 12)]
    )


def test_an_epoch_schedule_without_epochs_is_refused(tmp_path, monkeypatch, capsys) -> None:
    from fasttrain.train import main

    argv = ["model=mlp", "trainer.max_epochs=-1", "trainer.max_steps=60",
            f"paths.log_dir={tmp_path / 'logs'}"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert err[-1].startswith("error: model.scheduler_interval=epoch: ")
    assert "trainer.max_epochs=-1" in err[-1] and "model.scheduler_interval=step" in err[-1]
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").rglob("*.*"))


def test_the_classifier_refuses_it_too(tmp_path: Path) -> None:
    # Without the command line (a Classifier in a script): the same refusal, inside fit.
    import functools

    import lightning as L

    from fasttrain.models import Classifier
    from fasttrain.models.nets import MLP

    model = Classifier(
        net=MLP([4], 2), num_classes=2,
        optimizer=functools.partial(torch.optim.AdamW, lr=LR),
        scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR),
    )  # fmt: skip
    data = torch.utils.data.TensorDataset(torch.randn(8, 4), torch.randint(0, 2, (8,)))
    trainer = L.Trainer(max_epochs=-1, max_steps=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    with pytest.raises(UserError, match=r"model\.scheduler_interval=epoch"):
        trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4))


def test_a_run_max_steps_ends_mid_epoch_is_validated_and_checkpointed(tmp_path: Path) -> None:
    # Lightning validates only at an epoch's end: a run that max_steps ended on step 5 of 8
    # used to end with no val metrics and no best checkpoint (min_epochs: 1 held the stop).
    cfg = compose_train(tmp_path, "model=mlp", "data.num_workers=0", "logger=none", "test=false",
                        "trainer.max_epochs=3", "trainer.max_steps=5",
                        "trainer.limit_train_batches=8", "trainer.limit_val_batches=2",
                        "callbacks.progress_bar=null", "+trainer.enable_progress_bar=false",
                        quick=False)  # fmt: skip
    trainer, model, datamodule = build_run(cfg)
    fit.fit(trainer, model, datamodule, None)
    assert trainer.global_step == 5
    assert "val/loss" in trainer.callback_metrics
    best = trainer.checkpoint_callback.best_model_path
    assert best and Path(best).is_file(), best
