"""`oom_fallback=true`: on CUDA out-of-memory during fit, halve the micro-batch, double gradient
accumulation (the effective batch, and so the optimisation, stays the same) and fit again.

The weights and the trainer's progress are kept: fit resumes at the epoch that failed with the
smaller micro-batch. Below batch size 1 there is nothing left to halve and it gives up, with
torch.cuda.memory_summary() in the message. One process only: under DDP a rank that shrinks its
batch alone would fall out of step with the others.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

import lightning as L
import torch

log = logging.getLogger(__name__)


class OutOfMemoryFallbackError(RuntimeError):
    """Out of memory even at batch size 1."""


def memory_summary() -> str:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.memory_summary()
    return "(no CUDA device in use: no memory summary)"


def _reset_loaders(trainer: L.Trainer) -> None:
    # Rebuild the loaders with the new batch size on the next fit, as Lightning's own batch-size
    # finder does (tuner/batch_size_scaling.py `_reset_dataloaders`).
    trainer.fit_loop._combined_loader = None
    trainer.fit_loop.epoch_loop.val_loop._combined_loader = None


FitOnce = Callable[[L.Trainer, L.LightningModule, Any, "str | None"], None]


def plain_fit(
    trainer: L.Trainer, model: L.LightningModule, datamodule: Any, ckpt_path: str | None
) -> None:
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)


def fit(
    trainer: L.Trainer,
    model: L.LightningModule,
    datamodule: Any,
    ckpt_path: str | None = None,
    enabled: bool = False,
    fit_once: FitOnce = plain_fit,
) -> None:
    """`fit_once(trainer, model, datamodule, ckpt_path)`, retried smaller on OOM when `enabled`."""
    while True:
        try:
            fit_once(trainer, model, datamodule, ckpt_path)
            return
        except torch.OutOfMemoryError as err:
            if not enabled:
                raise
            reason = str(err).splitlines()[0] if str(err) else "CUDA out of memory"
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
        ckpt_path = None  # go on from the weights in memory, not back to the checkpoint
