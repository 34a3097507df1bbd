"""Test-only callback: SIGKILL the training process at a chosen step (never shipped in conf/).

Added to a run by override, with tests/ on PYTHONPATH:
    +callbacks.killer._target_=killer.Killer +callbacks.killer.at_step=7
"""

from __future__ import annotations

import os
import signal
from typing import Any, Literal

from lightning.pytorch.callbacks import Callback


def _die(*_: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Killer(Callback):
    """At the end of optimizer step `at_step`: die at once ("step"), or during the next
    checkpoint save, after its temp file is written and before it replaces the old file ("save")."""

    def __init__(self, at_step: int, mode: Literal["step", "save", "term"] = "step") -> None:
        self.at_step, self.mode = at_step, mode

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step != self.at_step:
            return
        if self.mode == "save":
            os.replace = _die  # the atomic save's last act; ModelCheckpoint saves right after
        elif self.mode == "term":
            os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler sends before it kills
        else:
            _die()
