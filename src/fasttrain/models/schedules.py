"""Learning-rate schedules torch does not ship as one class."""

from __future__ import annotations

import math
from typing import Annotated

import torch
from torch.optim.lr_scheduler import LRScheduler

from fasttrain.config.domains import AtLeast, Range, check_arguments


class WarmupCosine(LRScheduler):
    """Linear warm-up from ~0 to the optimizer's lr over `warmup_steps`, then a cosine down to
    `min_lr_ratio` x lr at `total_steps` (and flat after), as transformers are trained (GPT-2,
    nanoGPT). Its length `total_steps` left out of the config is set to the run's length
    (fasttrain.models.optim_plan), and re-planned when a resumed run is made longer: it is in the
    state_dict, as T_max is in CosineAnnealingLR's."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        total_steps: Annotated[int, AtLeast(1)],
        warmup_steps: Annotated[int, AtLeast(0)] = 100,
        min_lr_ratio: Annotated[float, Range(0, 1, what="a ratio")] = 0.1,
        last_epoch: Annotated[int, AtLeast(-1, note="-1: a new schedule")] = -1,
    ) -> None:
        check_arguments(WarmupCosine.__init__, locals())
        self.total_steps, self.warmup_steps = int(total_steps), int(warmup_steps)
        self.min_lr_ratio = float(min_lr_ratio)
        super().__init__(optimizer, last_epoch)

    def factor(self, step: int) -> float:
        """The share of the peak lr at optimizer step `step` (0-based)."""
        warmup = min(self.warmup_steps, self.total_steps - 1)
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, self.total_steps - warmup))
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (
            1 + math.cos(math.pi * progress)
        )

    def get_lr(self) -> list[float | torch.Tensor]:
        share = self.factor(self.last_epoch)
        return [group["initial_lr"] * share for group in self.optimizer.param_groups]
