"""Classification on the task contract (fasttrain.models.task): cross-entropy, accuracy."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from fasttrain.config.domains import Range, check_arguments
from fasttrain.config.errors import ConfigError
from fasttrain.models.spec import qualname
from fasttrain.models.task import (
    DATA_TARGET_KEY,
    OptimizerFactory,
    Task,
    scale_lr,
)

__all__ = ["DATA_TARGET_KEY", "Classifier", "scale_lr"]


class Classifier(Task):
    """Cross-entropy classification; logs train/loss, train/acc, val/loss, val/acc,
    val/acc_best, test/loss, test/acc. The best checkpoint keeps the highest val/acc.

    Args:
        net: any nn.Module mapping a batch [B, ...] to logits [B, num_classes].
        num_classes: number of classes, for the accuracy metrics.
        label_smoothing: the training loss's target smoothing (F.cross_entropy), in [0, 1).
            Validation and test losses stay plain cross-entropy, comparable between runs.
        the rest: as fasttrain.models.task.Task.
    """

    monitor = "val/acc"
    monitor_mode = "max"
    charts: ClassVar[dict[str, list[str]]] = {
        "accuracy: train vs val": [r"^train/acc$", r"^val/acc(_best)?$"]
    }
    train_sum_names = ("acc",)

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory | None,
        num_classes: int,  # checked when built: an image folder's count says more first
        label_smoothing: Annotated[float, Range(0, 1, high_open=True)] = 0.0,
        **base: Any,
    ) -> None:
        check_arguments(Classifier.__init__, locals())
        if num_classes < 2:
            raise ConfigError("num_classes", num_classes, "expected an int >= 2")
        super().__init__(net, optimizer, num_classes=num_classes,
                         label_smoothing=float(label_smoothing), **base)  # fmt: skip
        self.num_classes, self.label_smoothing = num_classes, float(label_smoothing)

    def loss(self, outputs: torch.Tensor, y: torch.Tensor, training: bool) -> torch.Tensor:
        smoothing = self.label_smoothing if training else 0.0
        return F.cross_entropy(outputs, y, label_smoothing=smoothing)

    def make_metrics(self) -> dict[str, Metric | MetricCollection]:
        # micro average = plain accuracy (fraction of correct predictions).
        return {"acc": MulticlassAccuracy(self.num_classes, average="micro")}

    def train_sums(self, outputs: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        return [(outputs.argmax(dim=-1) == y).sum(dtype=torch.float32)]

    def prediction_header(self, datamodule: Any) -> list[str]:
        names = self.class_names(datamodule)
        return ["pred", "class", "prob", *(f"prob_{n}" for n in names)]

    def prediction_rows(self, outputs: torch.Tensor, datamodule: Any) -> list[list[Any]]:
        """pred (class index), class (its name), prob (its probability), prob_<name> each."""
        names = self.class_names(datamodule)
        rows = []
        for p in outputs.float().softmax(dim=1).tolist():
            pred = max(range(len(p)), key=p.__getitem__)
            shown = [f"{v:.6f}" for v in p]
            rows.append([pred, names[pred], shown[pred], *shown])
        return rows

    def class_names(self, datamodule: Any) -> list[str]:
        """The data module's `class_names`, else the class indices as names ("0", "1", ...)."""
        names = getattr(datamodule, "class_names", None)
        return [str(n) for n in names] if names else [str(i) for i in range(self.num_classes)]

    def score(self) -> tuple[str, Metric]:
        return "accuracy", MulticlassAccuracy(self.num_classes, average="micro")

    def agreement(self, outputs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        return outputs.argmax(dim=1) == reference.argmax(dim=1)  # the same top-1 class

    def data_mismatch(self, datamodule: Any) -> str | None:
        classes = getattr(datamodule, "num_classes", self.num_classes)
        if classes == self.num_classes:
            return None
        return f"{self.num_classes} classes, but data has {classes}"


# Checkpoints written before the task contract record no task: every one of them is this task's
# (fasttrain.checkpoints.load reads them as such).
PRE_CONTRACT_TASK = qualname(Classifier)
