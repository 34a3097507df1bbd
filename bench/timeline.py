"""Callbacks that stamp wall-clock times of a run's start-up phases (overhead.py, startup.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import lightning as L


class Timeline(L.Callback):
    """Writes {"built", "train_start", "first_step_end"} as time.time() stamps to `path`."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.stamps = {"built": time.time()}  # built after imports and config composition

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.stamps["train_start"] = time.time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if batch_idx == 0:
            self.stamps["first_step_end"] = time.time()
            self.path.write_text(json.dumps(self.stamps))


class StartupStamps(L.Callback):
    """Adds "train_start" and "first_step_end" to `stamps` (the process's own, from its first
    line on) and writes them all to `path` at the end of the first step (startup.py)."""

    def __init__(self, stamps: dict[str, float], path: str) -> None:
        self.stamps, self.path = stamps, Path(path)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.stamps["train_start"] = time.time()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if "first_step_end" not in self.stamps:
            self.stamps["first_step_end"] = time.time()
            self.path.write_text(json.dumps(self.stamps))
