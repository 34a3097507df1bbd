"""Image folders (data=image_folder) and the uint8-to-device path: splits, labels, shapes,
augmentation by stage, on-device normalisation, class names, bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fasttrain.checkpoints.load import load_classifier
from fasttrain.models import Classifier
from fasttrain.models.nets import SmallCNN

MEAN, STD = [125.3, 123.0, 113.9], [63.0, 62.1, 66.7]


def test_classifier_normalises_uint8_on_the_device_as_the_host_reference(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = SmallCNN([3, 8, 8], 4, channels=[4])
    model = Classifier(net, None, 4, input_mean=MEAN, input_std=STD).eval()
    x = torch.randint(0, 256, (5, 3, 8, 8), dtype=torch.uint8)
    host = (x.float() - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    with torch.no_grad():
        assert torch.allclose(model(x), net(host), atol=1e-5)
    # The checkpoint carries the preprocessing: a reloaded model applies it too.
    ckpt = tmp_path / "m.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams)}, ckpt)
    rebuilt, _ = load_classifier(ckpt)
    with torch.no_grad():
        assert torch.allclose(rebuilt(x), net(host), atol=1e-5)
    assert rebuilt.hparams["input_mean"] == MEAN


def test_classifier_without_preprocessing_feeds_the_batch_unchanged() -> None:
    net = SmallCNN([1, 8, 8], 3, channels=[4]).eval()
    model = Classifier(net, None, 3).eval()
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.equal(model(x), net(x))
    assert model.input_mean is None and "input_mean" not in model.state_dict()
