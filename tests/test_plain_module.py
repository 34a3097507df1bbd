"""A plain LightningModule, written as lightning-hydra-template's MNISTLitModule is (its own
`__init__` that saves its hyperparameters, optimizer partial included; its own steps and
`configure_optimizers`): it trains, tests its best checkpoint, resumes and evaluates (its
checkpoints record the config that built it, and hold the optimizer's spec, never the pickled
partial, so they load with weights_only=True). Export and predict refuse it in one line naming
the methods it lacks (fasttrain.models.protocols), and work once it writes them."""

from __future__ import annotations

import functools
import logging
import re
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict
from practices import compose_train
from torchmetrics.classification import MulticlassAccuracy

from conftest import CONF
from fasttrain import Task
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


class LitDigitsExportable(LitDigits):
    """The same module with export's and predict's methods (fasttrain.Exportable, Predictable)."""

    def score(self) -> tuple[str, Any]:
        return "accuracy", MulticlassAccuracy(10, average="micro")

    def agreement(self, outputs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        return outputs.argmax(-1) == reference.argmax(-1)

    def prediction_header(self, datamodule: Any) -> list[str]:
        return ["pred"]

    def prediction_rows(self, outputs: torch.Tensor, datamodule: Any) -> list[list[Any]]:
        return [[int(k)] for k in outputs.argmax(-1)]


class LitWeighted(LitDigits):
    """The same module keeping a tensor among its hyperparameters (class weights, as a loss
    would take them)."""

    def __init__(self, net: torch.nn.Module, optimizer: Any, num_classes: int = 10,
                 weight_top: float = 2.0) -> None:  # fmt: skip
        super().__init__(net, optimizer, num_classes)
        self.hparams["class_weights"] = torch.linspace(1.0, weight_top, num_classes)


@pytest.fixture
def allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpoints may name these modules, as a project's conf/ would (model/*.yaml)."""
    from fasttrain.checkpoints import allow

    named = {**allow.conf_targets(), **{f"{__name__}.{c.__name__}": ("model/lit.yaml",)
                                        for c in (LitDigits, LitDigitsExportable,
                                                  LitWeighted)}}  # fmt: skip
    monkeypatch.setattr(allow, "conf_targets", lambda config_dir="": named)


def from_checkpoint(tmp_path: Any, entry: str, ckpt: Any, *more: str) -> Any:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        overrides = [f"ckpt_path={ckpt}", "data.num_workers=0", f"paths.root_dir={tmp_path}",
                     f"paths.output_dir={tmp_path}/{entry}", *more]  # fmt: skip
        return compose(entry, overrides=overrides)


def test_a_plain_lightning_module_trains_tests_its_best_checkpoint_resumes_and_evaluates(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], allowed: None
) -> None:
    from fasttrain.config.errors import UserError
    from fasttrain.tasks import evaluate, export, predict, train

    # the test of the best checkpoint read it with weights_only=True: a traceback after training
    metrics = train(plain_run(tmp_path, 2))
    assert 0.0 <= metrics["test/acc"] <= 1.0
    printed = capsys.readouterr().out
    # evaluate rebuilds it from the config its run recorded; export needs methods it lacks
    assert "checkpoint" in printed and "evaluate" in printed and "fasttrain.export" not in printed
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)
    assert saved["hyper_parameters"]["optimizer"]["_target_"] == "torch.optim.adamw.AdamW"
    assert saved["global_step"] == 10
    evaluated = evaluate(from_checkpoint(tmp_path, "eval", last))
    assert evaluated["test/acc"] == pytest.approx(metrics["test/acc"], abs=0.5)
    for entry, run, lacking in (("export", export, "score(), agreement()"),
                                ("predict", predict, "score(), prediction_header(), "
                                 "prediction_rows()")):  # fmt: skip
        with pytest.raises(UserError, match=rf"{entry} needs {re.escape(lacking)} of its module "
                                            "LitDigits, which does not define them"):  # fmt: skip
            run(from_checkpoint(tmp_path, entry, last))
        assert not (tmp_path / entry).exists() and not (tmp_path / "run" / "export").exists()
    train(plain_run(tmp_path, 3))  # resume=auto: from last.ckpt, one more epoch
    assert torch.load(last, weights_only=True)["global_step"] == 15


def test_a_plain_module_with_the_protocols_exports_and_predicts(
    tmp_path: Any, allowed: None
) -> None:
    from fasttrain.tasks import export, predict, train

    cfg = plain_run(tmp_path, 1)
    cfg.model._target_ = f"{__name__}.LitDigitsExportable"
    train(cfg)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    report = export(from_checkpoint(tmp_path, "export", last, "format=torchscript",
                                    "latency_time=0.01"))  # fmt: skip
    assert report["formats"]["torchscript"]["passed"], report["formats"]
    assert report["score"] == "accuracy"
    out = predict(from_checkpoint(tmp_path, "predict", last, f"output_dir={tmp_path}"))
    lines = out.read_text().splitlines()
    assert lines[0] == "index,pred,label" and len(lines) > 10


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


@pytest.mark.parametrize("spec, said", [
    ({"_target_": "os.system", "command": "touch pwned"}, "refused, its task names os.system"),
    ({"_target_": f"{__name__}.LitDigits", "optimizer": {"_target_": "builtins.exec"}},
     "refused, its optimizer names builtins.exec"),
    ("not a node", "refused, its model spec is not a config node"),
])  # fmt: skip
def test_a_crafted_model_spec_is_refused_before_anything_is_built(
    tmp_path: Any, allowed: None, spec: Any, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fasttrain.checkpoints.io import MODEL_SPEC_KEY
    from fasttrain.checkpoints.load import load_task
    from fasttrain.config.errors import UserError

    monkeypatch.chdir(tmp_path)  # where os.system("touch pwned") would write
    crafted = tmp_path / "crafted.ckpt"
    torch.save({"state_dict": {}, "datamodule_hyper_parameters": {}, MODEL_SPEC_KEY: spec},
               crafted)  # fmt: skip
    with pytest.raises(UserError, match=re.escape(said)):
        load_task(crafted)
    assert not (tmp_path / "pwned").exists()


class LossOnly(Task):
    """A Task that writes its loss alone: it trains and evaluates; export and predict ask for
    the rest."""

    def loss(self, outputs: torch.Tensor, y: torch.Tensor, training: bool) -> torch.Tensor:
        return F.cross_entropy(outputs, y)


def test_a_task_writing_only_its_loss_trains_evaluates_and_is_told_what_export_needs(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fasttrain.checkpoints import allow
    from fasttrain.config.errors import UserError
    from fasttrain.tasks import evaluate, export, predict, train

    named = {**allow.conf_targets(), f"{__name__}.LossOnly": ("model/loss_only.yaml",)}
    monkeypatch.setattr(allow, "conf_targets", lambda config_dir="": named)
    cfg = compose_train(tmp_path, *RUN, "trainer.max_epochs=1", quick=False)
    with open_dict(cfg):  # the MLP preset, less the classifier's own arguments
        for key in ("num_classes", "label_smoothing", "top_k", "mixup_alpha", "cutmix_alpha"):
            cfg.model.pop(key, None)
        cfg.model._target_ = f"{__name__}.LossOnly"
    assert "test/loss" in train(cfg)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    assert "test/loss" in evaluate(from_checkpoint(tmp_path, "eval", last))
    for entry, run, lacking in (("export", export, "score(), agreement()"),
                                ("predict", predict, "score(), prediction_header()")):  # fmt: skip
        with pytest.raises(UserError, match=rf"{entry} needs {re.escape(lacking)} of its module"):
            run(from_checkpoint(tmp_path, entry, last))


def test_a_tensor_among_the_hyperparameters_resumes_and_a_changed_one_is_said(
    tmp_path: Any, allowed: None, caplog: pytest.LogCaptureFixture
) -> None:
    """`==` on two tensors is a tensor whose truth is ambiguous: the resume check compares
    tensors by shape, dtype and values, and says which setting changed."""
    from fasttrain.tasks import train

    cfg = plain_run(tmp_path, 1)
    cfg.model._target_ = f"{__name__}.LitWeighted"
    train(cfg)
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    saved = torch.load(last, weights_only=True)["hyper_parameters"]["class_weights"]
    assert torch.equal(saved, torch.linspace(1.0, 2.0, 10))
    cfg = plain_run(tmp_path, 2)
    cfg.model._target_ = f"{__name__}.LitWeighted"
    with caplog.at_level(logging.WARNING):
        train(cfg)  # the same weights: resumed, nothing said about them
    assert torch.load(last, weights_only=True)["global_step"] == 10
    assert "class_weights" not in caplog.text
    cfg = plain_run(tmp_path, 3)
    cfg.model._target_ = f"{__name__}.LitWeighted"
    with open_dict(cfg):
        cfg.model.weight_top = 3.0
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        train(cfg)
    assert torch.load(last, weights_only=True)["global_step"] == 15
    assert "model.class_weights=" in caplog.text and "applies from here on" in caplog.text


def test_settings_that_differ_compares_tensors_and_a_partials_arguments() -> None:
    from fasttrain.checkpoints.fits import settings_that_differ

    def kept(**hparams: Any) -> dict[str, Any]:  # as the checkpoint holds them
        return loadable_hparams({"hyper_parameters": hparams})["hyper_parameters"]

    weights = torch.ones(3)
    sgd = functools.partial(torch.optim.SGD, lr=0.1)
    saved = kept(w=weights, optimizer=sgd)
    assert settings_that_differ(saved, {"w": weights.clone(), "optimizer": sgd}) == []
    for other in (torch.ones(4), torch.ones(3, dtype=torch.float64), torch.zeros(3), [1.0] * 3):
        (line,) = settings_that_differ(saved, {"w": other})
        assert line.startswith("model.w=") and line.endswith("applies from here on"), line
    (line,) = settings_that_differ(saved, {"optimizer": functools.partial(torch.optim.SGD, lr=0.2)})
    assert line.startswith("model.optimizer.lr=0.2 (the checkpoint's: 0.1) is ignored"), line
    big = settings_that_differ(kept(w=torch.ones(100)), {"w": torch.zeros(100)})
    assert big == ["model.w=<float32 tensor of shape [100]> (the checkpoint's: <float32 tensor "
                   "of shape [100]>) applies from here on"]  # fmt: skip


def test_a_partials_positional_arguments_are_kept_and_rebuilt() -> None:
    """A partial's positional arguments go into its spec as Hydra's `_args_` (with objects among
    them made specs too): the rebuilt partial calls as the run's did."""
    import math

    from hydra.utils import instantiate

    power = functools.partial(math.pow, 2.0)
    nested = functools.partial(max, functools.partial(math.pow, 3.0), key=None)
    hparams = loadable_hparams({"hyper_parameters": {"p": power, "n": nested}})["hyper_parameters"]
    assert hparams["p"] == {"_target_": "math.pow", "_partial_": True, "_args_": [2.0]}
    assert hparams["n"]["_args_"] == [{"_target_": "math.pow", "_partial_": True, "_args_": [3.0]}]
    rebuilt = instantiate(hparams["p"])
    assert rebuilt(5.0) == power(5.0) == 32.0
    torch.save(hparams, buffer := __import__("io").BytesIO())
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == hparams
