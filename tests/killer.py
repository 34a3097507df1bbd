"""Test-only callback: make a training run fail at a chosen step (never shipped in conf/).

Added to a run by override, with tests/ on PYTHONPATH:
    +callbacks.killer._target_=killer.Killer +callbacks.killer.at_step=7
"""

from __future__ import annotations

import errno
import os
import signal
from typing import Any, Literal

import torch
from lightning.pytorch.callbacks import Callback


def _die(*_: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _no_space(*_: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _term_then(replace: Any) -> Any:
    def replace_once(*args: Any) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        os.replace = replace
        replace(*args)

    return replace_once


class Killer(Callback):
    """At optimizer step `at_step` (on rank `rank`, or every rank if null):
    - "step": SIGKILL at the end of the step;
    - "save": SIGKILL during the next checkpoint save, after its temp file is written and
      before it replaces the old file;
    - "term": SIGTERM, what a scheduler sends before it kills;
    - "term_in_save": SIGTERM while the next checkpoint save writes (after fasttrain's own
      end-of-batch check for one: the signal lands where only Lightning sees it);
    - "term_in_val": SIGTERM during the first validation batch at that step;
    - "kill_in_val": SIGKILL there (the process dies before the epoch's end saves);
    - "raise_in_val": raise an exception there (a metric's bug, say);
    - "raise": raise an exception at the end of the step (a crash of this rank);
    - "raise_in_step": raise an exception as the next step starts (a bad batch, say);
    - "raise_in_backward": raise one in the next step's backward (inside the optimizer step);
    - "nan_grad": put a NaN into the first gradient of that step;
    - "disk_full": from then on every file flushed to disk fails as on a full disk (ENOSPC).
    """

    def __init__(
        self,
        at_step: int,
        mode: Literal[
            "step",
            "save",
            "term",
            "term_in_save",
            "term_in_val",
            "kill_in_val",
            "raise_in_val",
            "raise",
            "raise_in_step",
            "raise_in_backward",
            "nan_grad",
            "disk_full",
        ] = "step",
        rank: int | None = None,
    ) -> None:
        self.at_step, self.mode, self.rank = at_step, mode, rank

    def _due(self, trainer: Any) -> bool:
        mine = self.rank is None or trainer.global_rank == self.rank
        return mine and trainer.global_step == self.at_step

    def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
        if self.mode == "raise_in_backward" and self._due(trainer):
            raise RuntimeError(f"injected failure in step {trainer.global_step + 1}")
        if self.mode == "nan_grad" and self._due(trainer):
            with torch.no_grad():
                next(p for p in pl_module.parameters() if p.grad is not None).grad.fill_(
                    float("nan")
                )

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        if self.mode == "raise_in_step" and self._due(trainer):
            raise RuntimeError(f"injected failure before step {trainer.global_step + 1}")

    def on_validation_batch_start(self, trainer: Any, *args: Any) -> None:
        if self.mode == "term_in_val" and not trainer.sanity_checking and self._due(trainer):
            self.mode = "done"  # type: ignore[assignment]
            os.kill(os.getpid(), signal.SIGTERM)
        if self.mode == "kill_in_val" and not trainer.sanity_checking and self._due(trainer):
            _die()
        if self.mode == "raise_in_val" and not trainer.sanity_checking and self._due(trainer):
            raise RuntimeError(f"injected failure in the validation at step {trainer.global_step}")

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if not self._due(trainer):
            return
        if self.mode == "save":
            os.replace = _die  # the atomic save's last act; ModelCheckpoint saves right after
        elif self.mode == "term_in_save":
            os.replace = _term_then(os.replace)
        elif self.mode == "term":
            os.kill(os.getpid(), signal.SIGTERM)
        elif self.mode == "raise":
            raise RuntimeError(f"injected failure on rank {trainer.global_rank}")
        elif self.mode == "step":
            _die()
        elif self.mode == "disk_full":
            os.fsync = _no_space
