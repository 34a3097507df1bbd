"""The task contract from a project's side: a task written outside the package needs no
`__init__` (Task's arguments pass through), one with arguments of its own sets attributes after
`super().__init__()` and `make_metrics` reads them (Task's constructor never calls it), and the
config check knows Task's arguments on a project's task too."""

from __future__ import annotations

import functools
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanAbsoluteError, Metric

from fasttrain import Task, UserError
from fasttrain.config.schema import validate


class Plain(Task):
    """Task's arguments only: no __init__."""

    def loss(self, outputs: torch.Tensor, y: torch.Tensor, training: bool) -> torch.Tensor:
        return F.mse_loss(outputs, y)


class Weighted(Task):
    """An argument of its own, set after super().__init__() and read by make_metrics."""

    def __init__(self, net: torch.nn.Module, optimizer: Any, weight: float = 1.0, **base: Any):
        super().__init__(net, optimizer, weight=weight, **base)
        self.weight = weight

    def loss(self, outputs: torch.Tensor, y: torch.Tensor, training: bool) -> torch.Tensor:
        return self.weight * F.mse_loss(outputs, y)

    def make_metrics(self) -> dict[str, Metric]:
        return {f"mae_x{self.weight:g}": MeanAbsoluteError()}


def sgd() -> Any:
    return functools.partial(torch.optim.SGD, lr=0.01)


def test_a_task_without_init_takes_tasks_arguments() -> None:
    model = Plain(torch.nn.Linear(3, 1), sgd(), lr_scaling="sqrt", scheduler_interval="step")
    assert model.hparams["lr_scaling"] == "sqrt" and model.hparams["scheduler_interval"] == "step"
    rebuilt = Plain.from_hparams(dict(model.hparams))  # as a checkpoint rebuilds it
    assert rebuilt.hparams["lr_scaling"] == "sqrt"


def test_make_metrics_reads_what_the_subclass_set_and_a_trainer_builds_them() -> None:
    model = Weighted(torch.nn.Linear(3, 1), sgd(), weight=2.0)
    assert not hasattr(model, "val_metrics")  # not built by Task's constructor
    x, y = torch.randn(32, 3), torch.randn(32, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=8)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        accelerator="cpu")  # fmt: skip
    trainer.fit(model, loader, loader)
    assert "val/mae_x2" in trainer.callback_metrics
    assert Weighted.from_hparams(dict(model.hparams)).weight == 2.0


@pytest.mark.parametrize(
    ("key", "message"),
    [("lr_scalling", "did you mean lr_scaling"), ("wieght", "did you mean weight")],
)
def test_the_config_check_knows_tasks_arguments_on_a_projects_task(key: str, message: str):
    net = {"_target_": "torch.nn.Linear", "in_features": 3, "out_features": 1}
    optimizer = {"_target_": "torch.optim.SGD", "_partial_": True, "lr": 0.01}
    parts = {"_target_": f"{__name__}.Weighted", "net": net, "optimizer": optimizer}
    with pytest.raises(UserError, match=message):
        validate(OmegaConf.create({**parts, key: 1}), "model")
    validate(OmegaConf.create({**parts, "lr_scaling": "sqrt", "weight": 0.5}), "model")
