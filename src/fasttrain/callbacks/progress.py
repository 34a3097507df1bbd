"""The progress bar: Lightning's rich bar, fed host values the module read on a logging step.

Anything logged with `self.log(..., prog_bar=True)` in `training_step` is turned into a Python
number by Lightning after every batch (a device-to-host sync per step on a GPU, whether or not a
bar is shown), and again on every later batch of the epoch. A fasttrain task instead keeps the
values it read on its last logging step in `pl_module.progress` (plain floats); this bar shows
them beside Lightning's own (epoch-level validation values, the version).
"""

from __future__ import annotations

import time
from typing import Annotated, Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar

from fasttrain.config.domains import AtLeast, check_arguments


class ProgressBar(RichProgressBar):
    """RichProgressBar that also shows `pl_module.progress` (a dict of floats), if it has one.

    Args:
        refresh_rate: redraws per second. Rich redraws in a thread of the training process,
            which takes the GIL from the training loop each time: Lightning's 100 per second is
            more than an eye reads; 10 by default here.
        **kwargs: as RichProgressBar (leave, theme, console_kwargs).
    """

    def __init__(self, refresh_rate: Annotated[int, AtLeast(0)] = 10, **kwargs: Any) -> None:
        check_arguments(ProgressBar.__init__, locals())
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self._next_update = 0.0  # monotonic time of the next bar update

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, i: int
    ) -> None:
        # Lightning updates the bar's count and values after every batch, though it is drawn
        # only refresh_rate times a second: update as often as it is drawn, and at the last batch.
        now = time.monotonic()
        if now < self._next_update and i + 1 < self.total_train_batches:
            return
        self._next_update = now + 1.0 / max(1, self.refresh_rate)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, i)

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, Any]:
        shown = getattr(pl_module, "progress", None)
        metrics = super().get_metrics(trainer, pl_module)
        return {**metrics, **shown} if isinstance(shown, dict) else metrics
