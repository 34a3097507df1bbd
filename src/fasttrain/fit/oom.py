"""The out-of-memory retry of `oom_fallback=true` (fasttrain.fit.fit), loaded only when a run
has run out of memory."""

from __future__ import annotations

import gc
import logging
from typing import Any

import lightning as L
import torch

log = logging.getLogger(__name__)


class OutOfMemoryFallbackError(RuntimeError):
    """Out of memory even at batch size 1."""


def shrink_batch(trainer: L.Trainer, datamodule: Any, reason: str) -> None:
    """Half the micro-batch, twice the accumulation (the effective batch stays), the loaders
    rebuilt at the next fit; OutOfMemoryFallbackError where the batch is 1 already."""
    batch, accumulate = datamodule.batch_size, trainer.accumulate_grad_batches
    gc.collect()  # the failed step's tensors, unreferenced now that the exception is gone
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if batch <= 1:
        raise OutOfMemoryFallbackError(
            f"out of memory at batch size 1 ({reason}); oom_fallback has nothing left to "
            "halve: use a smaller model, trainer.precision=bf16-mixed, or more GPUs.\n"
            f"{memory_summary()}"
        )
    datamodule.batch_size = batch // 2
    trainer.accumulate_grad_batches = accumulate * 2
    log.warning(
        "oom_fallback: out of memory at batch size %d (%s); continuing with batch size %d "
        "and accumulate_grad_batches=%d (effective batch %d -> %d)\n%s",
        batch, reason, batch // 2, accumulate * 2, batch * accumulate,
        batch // 2 * accumulate * 2, memory_summary(),
    )  # fmt: skip
    _reset_loaders(trainer)


def memory_summary() -> str:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.memory_summary()
    return "(no CUDA device in use: no memory summary)"


def _reset_loaders(trainer: L.Trainer) -> None:
    # Private: Lightning has no public "rebuild the loaders on the next fit"; its own batch-size
    # finder does this (tuner/batch_size_scaling.py). tests/test_internals.py fails if it goes.
    trainer.fit_loop._combined_loader = None
    trainer.fit_loop.epoch_loop.val_loop._combined_loader = None
