"""What an exported file takes: raw inputs, with the data module's preprocessing inside the file.

A net is trained on preprocessed inputs (digits: pixels standardised with the training split's
mean and std). A deployment has raw inputs, so every export is `Standardize(mean, std)` then the
net, and `predict input=` applies the same to the arrays it reads. A data module states its
preprocessing with `input_statistics() -> (mean, std)`: net input = (raw - mean) / std; a data
module without that method feeds its inputs to the net unchanged. A model that preprocesses on
the device (a task's `input_mean`/`input_std`: image data sets send raw uint8 pixels) carries
its own, which then wins, and its data module's batches are raw already.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from fasttrain.deploy.formats import Standardize


def input_statistics(datamodule: Any, model: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, std) float32, broadcastable to [B, *input_shape]: the model's own preprocessing
    when it has one, else the data module's; (0, 1) when neither states any."""
    own = on_model(model)
    if own is not None:
        return own
    stated = getattr(datamodule, "input_statistics", None)
    if stated is None:
        return torch.zeros(()), torch.ones(())
    mean, std = stated()
    return torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32)


def on_model(model: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The (mean, std) a model applies itself on the device, or None."""
    mean, std = getattr(model, "input_mean", None), getattr(model, "input_std", None)
    if mean is None or std is None:
        return None
    return mean.detach().float().cpu(), std.detach().float().cpu()


def with_preprocessing(
    net: nn.Module, mean: torch.Tensor, std: torch.Tensor, output: nn.Module | None = None
) -> nn.Module:
    """raw x [B, *input_shape] -> the task's outputs: the net behind its input preprocessing,
    then the task's output layer (e.g. a regressor's targets back in their own units)."""
    return nn.Sequential(Standardize(mean, std), net, *([output] if output else [])).eval()


def raw_batches(
    batches: Iterable[tuple[torch.Tensor, Any]],
    mean: torch.Tensor,
    std: torch.Tensor,
    model: Any = None,
) -> Iterator[tuple[torch.Tensor, Any]]:
    """A data module's (preprocessed x, y) batches as raw ones: x * std + mean (to float
    rounding: digits' pixels come back as 0..16 within 1e-5). For a model that preprocesses on
    the device the batches are raw already (uint8 pixels): only made float32."""
    raw = on_model(model) is not None
    for x, y in batches:
        yield (x.float() if raw else x * std + mean), y


def describe(mean: torch.Tensor, std: torch.Tensor, input_shape: Any) -> dict[str, str]:
    """The metadata each file carries, and the report's `input` section (strings: ONNX
    metadata_props hold strings only)."""
    shape = ", ".join(map(str, input_shape))
    return {
        "input": f"raw float32 [N, {shape}], as the data set stores it (not standardised)",
        "preprocessing": "inside the file: (input - mean) / std, then the net",
        "mean": _number(mean),
        "std": _number(std),
    }


def _number(t: torch.Tensor) -> str:
    """A scalar as its value, a per-feature tensor as a flat list (row-major, input_shape)."""
    return f"{t.item():.9g}" if t.numel() == 1 else str([round(v, 9) for v in t.flatten().tolist()])
