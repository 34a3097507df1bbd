"""Regression on the task contract (fasttrain.models.task): MSE or Huber loss on standardised
targets, metrics and predictions in the targets' own units."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MeanAbsoluteError, MeanSquaredError, Metric, MetricCollection, R2Score

from fasttrain.config.domains import AtLeast, Positive, check_arguments
from fasttrain.models.task import OptimizerFactory, Task

Loss = Literal["mse", "huber"]
# Two outputs are the same answer when they differ by at most this share of the target's std.
AGREEMENT_STDS = 0.01


class TargetScale(nn.Module):
    """Standardised outputs -> the targets' own units: y = z * std + mean, per target. Its buffers
    hold the training split's target statistics, so the checkpoint and every export carry them."""

    def __init__(self, num_targets: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(num_targets))
        self.register_buffer("std", torch.ones(num_targets))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z * self.std + self.mean  # type: ignore[operator]

    def standardized(self, y: torch.Tensor) -> torch.Tensor:
        return (y - self.mean) / self.std  # type: ignore[operator]


class Regressor(Task):
    """Real-valued targets [B, num_targets]; logs train/loss, train/mse, val/loss, val/mse,
    val/mae, val/r2, val/mse_best and their test/ values. The best checkpoint keeps the lowest
    val/mse. The net learns standardised targets (training-split mean and std, from the data
    module's `target_statistics()`); metrics, predictions and exports are in the targets' units.

    Args:
        net: any nn.Module mapping a batch [B, ...] to [B, num_targets].
        num_targets: values predicted per sample.
        loss: "mse" or "huber" (robust to outliers; `huber_delta` in target standard deviations),
            on the standardised targets. val/loss is the same loss, val/mse the plain MSE.
        the rest: as fasttrain.models.task.Task.
    """

    monitor = "val/mse"
    monitor_mode = "min"
    charts: ClassVar[dict[str, list[str]]] = {
        "mse: train vs val": [r"^train/mse$", r"^val/mse(_best)?$"],
        # R^2 on its own chart: beside MAE (in the targets' units) its 0..1 scale reads flat
        "R2: val": [r"^val/r2$"],
    }
    train_sum_names = ("mse",)

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory | None,
        num_targets: Annotated[int, AtLeast(1)] = 1,
        loss: Loss = "mse",
        huber_delta: Annotated[float, Positive] = 1.0,
        **base: Any,
    ) -> None:
        check_arguments(Regressor.__init__, locals())
        super().__init__(net, optimizer, num_targets=num_targets, loss=loss,
                         huber_delta=float(huber_delta), **base)  # fmt: skip
        self.num_targets, self.loss_name, self.huber_delta = num_targets, loss, float(huber_delta)
        self.target_scale = TargetScale(num_targets)

    def setup(self, stage: str) -> None:
        # The training split's target statistics; a resumed run or a loaded checkpoint gets the
        # recorded ones back (they are buffers of the state_dict).
        datamodule = getattr(self.trainer, "datamodule", None)
        stats = getattr(datamodule, "target_statistics", None)
        if stage == "fit" and stats is not None:
            mean, std = stats()
            self.target_scale.mean.copy_(mean.reshape(-1))  # type: ignore[operator]
            self.target_scale.std.copy_(std.reshape(-1))  # type: ignore[operator]

    def loss(self, outputs: torch.Tensor, y: torch.Tensor, training: bool) -> torch.Tensor:
        z = self.target_scale.standardized(y.view_as(outputs).to(outputs.dtype))
        if self.loss_name == "huber":
            return F.huber_loss(outputs, z, delta=self.huber_delta)
        return F.mse_loss(outputs, z)

    def output_layer(self) -> nn.Module:
        return self.target_scale

    def make_metrics(self) -> dict[str, Metric | MetricCollection]:
        # Over [B, num_targets]: MSE and MAE over every value, R^2 averaged over the targets.
        return {"mse": MeanSquaredError(), "mae": MeanAbsoluteError(), "r2": R2Score()}

    def train_sums(self, outputs: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        # Squared error in the targets' units, averaged over targets, summed over the batch.
        error = self.target_scale(outputs.float()) - y.view_as(outputs)
        return [error.square().mean(dim=1).sum()]

    def prediction_header(self, datamodule: Any) -> list[str]:
        return [f"pred_{name}" for name in self.target_names(datamodule)]

    def prediction_rows(self, outputs: torch.Tensor, datamodule: Any) -> list[list[Any]]:
        return [
            [f"{v:.6g}" for v in row] for row in outputs.float().reshape(len(outputs), -1).tolist()
        ]

    def target_names(self, datamodule: Any) -> list[str]:
        """The data module's `target_names`, else "target" (one) or "target_0", "target_1"..."""
        names = getattr(datamodule, "target_names", None)
        if names:
            return [str(n) for n in names]
        return (
            ["target"]
            if self.num_targets == 1
            else [f"target_{i}" for i in range(self.num_targets)]
        )

    def score(self) -> tuple[str, Metric]:
        return "r2", R2Score()

    def deviation(self, outputs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        # In target standard deviations: the net's own scale, whatever the targets' units.
        std = self.target_scale.std.to(outputs.device)  # type: ignore[operator]
        return (outputs - reference).abs() / std  # type: ignore[operator]

    def agreement(self, outputs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        return (
            (self.deviation(outputs, reference) <= AGREEMENT_STDS)
            .reshape(len(outputs), -1)
            .all(dim=1)
        )

    def data_mismatch(self, datamodule: Any) -> str | None:
        targets = getattr(datamodule, "num_targets", None)
        if targets == self.num_targets:
            return None
        return f"{self.num_targets} regression targets, but data has " + (
            f"{targets}" if targets is not None else "none (class labels?)"
        )
