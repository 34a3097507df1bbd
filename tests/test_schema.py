"""Config nodes are checked against the signatures of the classes they name."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from fasttrain.config.errors import UserError
from fasttrain.config.schema import validate


def check(node: dict) -> None:
    validate(OmegaConf.create(node))


def test_valid_nested_config_passes() -> None:
    net = {"_target_": "fasttrain.models.nets.MLP", "input_shape": [4], "num_classes": 3}
    check(
        {
            "model": {
                "_target_": "fasttrain.models.Classifier",
                "num_classes": 3,
                "optimizer": None,
                "net": net,
            }
        }
    )


T, D, N = (
    "lightning.pytorch.Trainer",
    "fasttrain.data.DigitsDataModule",
    "fasttrain.models.nets.MLP",
)


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({"t": {"_target_": T, "max_epoch": 3}}, "did you mean max_epochs?"),
        ({"t": {"_target_": T, "max_epochs": "ten"}}, "t.max_epochs='ten': expected int or null"),
        ({"t": {"_target_": T, "precision": "17"}}, "t.precision='17': expected one of 64, 32, 16"),
        ({"t": {"_target_": T, "deterministic": "yes"}}, "t.deterministic='yes'"),
        ({"d": {"_target_": D, "batch_size": 1.5}}, "d.batch_size=1.5: expected int"),
        ({"d": {"_target_": D, "num_workers": "many"}}, "expected one of 'auto' or int"),
        ({"d": {"_target_": D, "input_shape": [1, "x"]}}, "d.input_shape"),
        ({"n": {"_target_": N, "input_shape": [4]}}, "n.num_classes is required"),
        ({"n": {"_target_": N, "input_shape": [4], "num_classes": 2, "init": "he"}}, "'kaiming'"),
        ({"n": {"_target_": "no.such.Thing"}}, "n._target_=no.such.Thing: cannot be imported"),
        ({"ckpt_path": "???"}, "ckpt_path is required"),
    ],
)  # fmt: skip
def test_problems_are_reported_with_the_override_path(node: dict, message: str) -> None:
    with pytest.raises(UserError) as err:
        check(node)
    assert message in str(err.value)


def test_partial_nodes_may_omit_required_arguments() -> None:
    check({"opt": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 0.1}})
    with pytest.raises(UserError, match=r"opt\.lr='fast'"):
        check({"opt": {"_target_": "torch.optim.AdamW", "_partial_": True, "lr": "fast"}})


def test_subclass_kwargs_are_checked_against_the_base_class() -> None:
    # DigitsDataModule passes **loader on to TensorDataModule: its arguments are checked too.
    with pytest.raises(UserError, match="did you mean batch_size"):
        check({"d": {"_target_": "fasttrain.data.DigitsDataModule", "batch_sise": 3}})


def test_third_party_kwargs_are_accepted() -> None:
    # TensorBoardLogger forwards **kwargs to SummaryWriter: extra keys are not errors.
    check(
        {
            "l": {
                "_target_": "lightning.pytorch.loggers.TensorBoardLogger",
                "save_dir": "x",
                "flush_secs": 5,
            }
        }
    )
