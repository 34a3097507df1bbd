"""Nets, init schemes, and the Classifier's checkpoint contract (plain hparams, safe reload)."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from fasttrain.checkpoints.load import load_task
from fasttrain.config.errors import ConfigError, UserError
from fasttrain.models import Classifier
from fasttrain.models.nets import MLP, ResNet, SmallCNN
from fasttrain.models.spec import spec_of


@pytest.mark.parametrize("net_cls", [MLP, SmallCNN, ResNet])
@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 32, 32), (3, 5, 9)])
def test_nets_map_any_image_shape_to_logits(net_cls, shape) -> None:
    net = net_cls(input_shape=list(shape), num_classes=7)
    assert net(torch.randn(4, *shape)).shape == (4, 7)


def test_kaiming_and_xavier_init_take_effect() -> None:
    torch.manual_seed(0)
    wide = {
        s: MLP([1, 32, 32], 10, hidden=[512], init=s).layers[1].weight
        for s in ("default", "kaiming", "xavier")
    }
    fan_in, fan_out = 1024, 512
    assert wide["kaiming"].std().item() == pytest.approx(math.sqrt(2 / fan_in), rel=0.05)
    assert wide["xavier"].std().item() == pytest.approx(math.sqrt(2 / (fan_in + fan_out)), rel=0.05)
    # PyTorch's default (kaiming_uniform with a=sqrt(5)) is ~1/sqrt(3 fan_in): clearly different
    assert wide["default"].std().item() == pytest.approx(1 / math.sqrt(3 * fan_in), rel=0.05)
    assert MLP([4], 2, init="kaiming").layers[1].bias.abs().sum() == 0


def test_init_rejects_unknown_scheme() -> None:
    with pytest.raises(ConfigError, match="expected one of 'default', 'kaiming', 'xavier'"):
        MLP([4], 2, init="orthogonal")


def make_classifier() -> Classifier:
    return Classifier(
        net=SmallCNN([1, 8, 8], 10, channels=[8]),
        optimizer=functools.partial(torch.optim.SGD, lr=0.1, momentum=0.9),
        scheduler=functools.partial(torch.optim.lr_scheduler.CosineAnnealingLR, T_max=3),
        num_classes=10,
    )


def test_hparams_are_plain_hydra_specs() -> None:
    hp = dict(make_classifier().hparams)
    assert hp["net"] == {
        "_target_": "fasttrain.models.nets.cnn.SmallCNN", "input_shape": [1, 8, 8],
        "num_classes": 10, "channels": [8], "dropout": 0.1, "init": "default",
    }  # fmt: skip
    assert hp["optimizer"] == {
        "_target_": "torch.optim.sgd.SGD",
        "_partial_": True,
        "lr": 0.1,
        "momentum": 0.9,
    }
    assert spec_of(torch.nn.Linear(2, 2)) is None  # a net without recorded args: no spec


def test_checkpoint_round_trip_rebuilds_the_same_model(tmp_path) -> None:
    import lightning as L

    model = make_classifier()
    quiet = {"enable_progress_bar": False, "enable_model_summary": False}
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, **quiet)
    data = torch.utils.data.TensorDataset(torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,)))
    trainer.fit(model, torch.utils.data.DataLoader(data, batch_size=4))
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    rebuilt, _ = load_task(path)
    x = torch.randn(5, 1, 8, 8)
    model.eval()
    assert torch.equal(rebuilt(x), model(x))
    assert dict(rebuilt.hparams) == dict(model.hparams)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        (b"not a checkpoint", "not a readable checkpoint"),
        (
            {"state_dict": {}, "hyper_parameters": {"lr": 1}},
            "not a fasttrain task checkpoint",
        ),
        ({"weights": 1}, "not a Lightning checkpoint"),
    ],
)
def test_bad_checkpoints_are_refused_clearly(tmp_path, content, message) -> None:
    path = tmp_path / "x.ckpt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        torch.save(content, path)
    with pytest.raises(UserError, match=message):
        load_task(path)


def test_classifier_rejects_bad_values() -> None:
    with pytest.raises(ConfigError, match="num_classes"):
        Classifier(net=torch.nn.Linear(2, 1), optimizer=None, num_classes=1)


def test_resnet18_has_the_standard_size() -> None:
    net = ResNet([3, 32, 32], 10)  # defaults are ResNet-18: [2, 2, 2, 2] blocks, 64..512 wide
    params = sum(p.numel() for p in net.parameters())
    assert 11_100_000 < params < 11_250_000  # CIFAR ResNet-18 has ~11.17 M parameters
