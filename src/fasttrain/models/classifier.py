"""Classification task logic around any nn.Module: loss, metrics, optimizer and schedule."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MaxMetric
from torchmetrics.classification import MulticlassAccuracy

from fasttrain.checkpoint import spec_of
from fasttrain.errors import ConfigError

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]


class Classifier(L.LightningModule):
    """Cross-entropy classification; logs train/loss, val/loss, val/acc, val/acc_best, test/acc.

    Args:
        net: any nn.Module mapping a batch [B, ...] to logits [B, num_classes].
        optimizer: a factory taking the parameters (Hydra `_partial_: true`).
        num_classes: number of classes, for the accuracy metrics.
        scheduler: a factory taking the optimizer, or None for a constant learning rate.
        scheduler_interval: step the scheduler every "epoch" or every optimizer "step".
    """

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory | None,
        num_classes: int,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ConfigError("num_classes", num_classes, "expected an int >= 2")
        if scheduler_interval not in ("epoch", "step"):
            raise ConfigError("scheduler_interval", scheduler_interval, "expected epoch or step")
        self.net = net
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        # Plain specs, never objects: checkpoints then load with torch.load(weights_only=True).
        self.save_hyperparameters({
            "net": spec_of(net), "optimizer": spec_of(optimizer), "scheduler": spec_of(scheduler),
            "num_classes": num_classes, "scheduler_interval": scheduler_interval,
        })  # fmt: skip
        # micro average = plain accuracy (fraction of correct predictions).
        self.train_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc_best = MaxMetric()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def _shared_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits, y), logits.detach(), y

    def on_train_start(self) -> None:
        # The sanity-check validation ran on an untrained net; its accuracy is not a "best".
        self.val_acc_best.reset()

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        loss, logits, y = self._shared_step(batch)
        self.train_acc.update(logits, y)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, logits, y = self._shared_step(batch)
        self.val_acc.update(logits, y)
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, sync_dist=True)
        self.log("val/acc", self.val_acc, on_epoch=True, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True)

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, logits, y = self._shared_step(batch)
        self.test_acc.update(logits, y)
        self.log("test/loss", loss, on_epoch=True, sync_dist=True)
        self.log("test/acc", self.test_acc, on_epoch=True)

    def configure_optimizers(self) -> Any:
        if self.optimizer_factory is None:
            raise ConfigError("optimizer", None, "training needs an optimizer factory")
        optimizer = self.optimizer_factory(self.parameters())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        interval = self.hparams["scheduler_interval"]
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": interval},
        }
