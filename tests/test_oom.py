"""oom_fallback: on out-of-memory, halve the micro-batch and double accumulation, then go on."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from practices import build_run, compose_train

from fasttrain import fit
from fasttrain.fit.oom import OutOfMemoryFallbackError
from fasttrain.models.nets import MLP


class RunsOutAbove(MLP):
    """Raises CUDA's out-of-memory error for batches larger than `limit`."""

    def __init__(self, *args, limit: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limit = limit
        self.sizes: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {x.shape[0]} rows")
        self.sizes.append(x.shape[0])
        return super().forward(x)


def run(tmp_path: Path, limit: int, enabled: bool = True):
    cfg = compose_train(tmp_path, "trainer.accelerator=cpu", "trainer.devices=1",
                        "data.batch_size=32", "trainer.limit_train_batches=8")  # fmt: skip
    net = RunsOutAbove([1, 8, 8], 10, hidden=[16], limit=limit)
    trainer, model, datamodule = build_run(cfg, net=net)
    fit.fit(trainer, model, datamodule, oom_fallback=enabled)
    return trainer, datamodule, net


def test_halves_batch_doubles_accumulation_and_continues(tmp_path: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="fasttrain.fit"):
        trainer, datamodule, net = run(tmp_path, limit=8)
    assert datamodule.batch_size == 8 and trainer.accumulate_grad_batches == 4
    assert set(net.sizes) == {8}  # every step that ran used the batch that fits
    assert trainer.global_step == 8 // 4  # effective batch 32 kept: 8 micro-batches, 2 steps
    said = [r.getMessage() for r in caplog.records if "oom_fallback" in r.getMessage()]
    assert len(said) == 2
    assert "batch size 32" in said[0] and "batch size 16" in said[0]
    assert "effective batch 32 -> 32" in said[1]
    assert "memory summary" in said[0]  # no CUDA here: the summary says so


def test_gives_up_at_batch_size_1(tmp_path: Path) -> None:
    with pytest.raises(OutOfMemoryFallbackError, match="out of memory at batch size 1"):
        run(tmp_path, limit=0)


def test_off_by_default_reraises(tmp_path: Path) -> None:
    with pytest.raises(torch.OutOfMemoryError):
        run(tmp_path, limit=8, enabled=False)
