"""A multi-layer perceptron over flattened inputs."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Annotated

import torch
from lightning.pytorch.core.mixins import HyperparametersMixin
from torch import nn

from fasttrain.config.domains import AtLeast, Probability, Range, Shape, check_arguments
from fasttrain.config.errors import check_shape
from fasttrain.models.nets.init import InitScheme, init_weights


class MLP(HyperparametersMixin, nn.Module):
    """[B, *input_shape] -> flatten -> (Linear, ReLU, Dropout) x len(hidden) -> Linear -> [B, C]."""

    def __init__(
        self,
        input_shape: Shape,
        num_classes: Annotated[int, AtLeast(1)],
        hidden: Annotated[Sequence[int], Range(1, what="layer widths", empty=True)] = (128, 128),
        dropout: Annotated[float, Probability] = 0.1,
        init: InitScheme = "default",
    ) -> None:
        super().__init__()
        check_arguments(MLP.__init__, locals())
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
