"""A plain LightningModule, written as lightning-hydra-template's MNISTLitModule is (its own
`__init__` that saves its hyperparameters, optimizer partial included; its own steps and
`configure_optimizers`): it trains, tests its best checkpoint and resumes. Its checkpoints hold
the optimizer's spec, never the pickled partial, so they load with weights_only=True; evaluate
and export, which rebuild only a Task, are not printed for it."""

from __future__ import annotations

import functools
import logging
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf, open_dict
from practices import compose_train
from torchmetrics.classification import MulticlassAccuracy

from fasttrain.checkpoints.io import loadable_hparams
from fasttrain.models.nets import MLP


class LitDigits(L.LightningModule):
    def __init__(self, net: torch.nn.Module, optimizer: Any, num_classes: int = 10) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False, ignore=["net"])
        self.net, self.optimizer = net, optimizer
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.float())

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train/loss", loss, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val/loss", F.cross_entropy(logits, y))
        self.val_acc(logits, y)
        self.log("val/acc", self.val_acc)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.test_acc(self(x), y)
        self.log("test/acc", self.test_acc)

    def configure_optimizers(self) -> Any:
        return self.optimizer(self.parameters())


RUN = ["model=mlp", "data.num_workers=0", "logger=none", "callbacks.progress_bar=null",
       "trainer.limit_train_batches=5", "trainer.limit_val_batches=2",
       "trainer.limit_test_batches=2", "+trainer.enable_model_summary=false"]  # fmt: skip


def plain_run(tmp_path: Any, epochs: int) -> Any:
    cfg = compose_train(tmp_path, *RUN, f"trainer.max_epochs={epochs}", quick=False)
    with open_dict(cfg):  # the MLP preset's net and optimizer, around the plain module
        for key in [k for k in cfg.model if k not in ("net", "optimizer")]:
            del cfg.model[key]
        cfg.model._target_ = f"{__name__}.LitDigits"
    return cfg


def test_a_plain_lightning_module_trains_tests_its_best_checkpoint_and_resumes(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from fasttrain.tasks import train

    # the test of the best checkpoint read it with weights_only=True: a traceback after training
    metrics = train(plain_run(tmp_path, 2))
    assert 0.0 <= metrics["test/acc"] <= 1.0
    printed = capsys.readouterr().out
    assert "checkpoint" in printed and "evaluate" not in printed and "export" not in printed
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    assert saved["hyper_parameters"]["optimizer"]["_target_"] == "torch.optim.adamw.AdamW"
    assert saved["global_step"] == 10
    train(plain_run(tmp_path, 3))  # resume=auto: from last.ckpt, one more epoch
    assert torch.load(last, weights_only=True)["global_step"] == 15


def test_objects_in_hyperparameters_become_specs_or_are_left_out_said_once(caplog) -> None:
    optimizer = functools.partial(torch.optim.SGD, lr=0.1)
    checkpoint = {"state_dict": {}, "hyper_parameters": {
        "optimizer": optimizer, "net": MLP([4], 2), "plain_net": torch.nn.Linear(4, 2),
        "sizes": (1, 2), "nested": {"cfg": OmegaConf.create({"a": [1, 2]})},
    }}  # fmt: skip
    with caplog.at_level(logging.WARNING):
        hparams = loadable_hparams(checkpoint)["hyper_parameters"]
    assert hparams["optimizer"] == {"_target_": "torch.optim.sgd.SGD", "_partial_": True,
                                    "lr": 0.1}  # fmt: skip
    assert hparams["net"]["_target_"] == "fasttrain.models.nets.mlp.MLP"
    assert "plain_net" not in hparams and "hyper_parameters.plain_net: a Linear" in caplog.text
    assert hparams["sizes"] == (1, 2) and hparams["nested"] == {"cfg": {"a": [1, 2]}}
    assert checkpoint["hyper_parameters"]["optimizer"] is optimizer  # the run's own untouched
    plain = {"state_dict": {}, "hyper_parameters": {"lr_scaling": "none", "input_mean": [0.5]}}
    assert loadable_hparams(plain) == plain  # a Task's plain values pass through as they are
