"""A multi-layer perceptron over flattened inputs."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from lightning.pytorch.core.mixins import HyperparametersMixin
from torch import nn

from fasttrain.config.errors import ConfigError, check_shape
from fasttrain.models.nets.init import InitScheme, init_weights


class MLP(HyperparametersMixin, nn.Module):
    """[B, *input_shape] -> flatten -> (Linear, ReLU, Dropout) x len(hidden) -> Linear -> [B, C]."""

    def __init__(
        self,
        input_shape: Sequence[int],
        num_classes: int,
        hidden: Sequence[int] = (128, 128),
        dropout: float = 0.1,
        init: InitScheme = "default",
    ) -> None:
        super().__init__()
        if not 0.0 <= dropout < 1.0:
            raise ConfigError("dropout", dropout, "expected a probability in [0, 1)")
        if any(h < 1 for h in hidden):
            raise ConfigError("hidden", list(hidden), "expected layer widths >= 1")
        self.save_hyperparameters()
        widths = [math.prod(check_shape(input_shape)), *hidden]
        layers: list[nn.Module] = [nn.Flatten()]
        for w_in, w_out in itertools.pairwise(widths):
            layers += [nn.Linear(w_in, w_out), nn.ReLU(inplace=True), nn.Dropout(dropout)]
        layers.append(nn.Linear(widths[-1], num_classes))
        self.layers = nn.Sequential(*layers)
        init_weights(self, init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)
