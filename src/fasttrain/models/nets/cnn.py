"""A small VGG-style CNN: enough for digits, and a realistic conv workload for GPU benchmarks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import torch
from lightning.pytorch.core.mixins import HyperparametersMixin
from torch import nn

from fasttrain.config.domains import AtLeast, Probability, Shape, check_arguments
from fasttrain.config.errors import ConfigError, check_shape
from fasttrain.models.nets.init import InitScheme, Widths, init_weights


class SmallCNN(HyperparametersMixin, nn.Module):
    """Per stage: (Conv3x3, BatchNorm, ReLU) x 2, then 2x2 max-pool while the image is > 1 px.

    [B, C_in, H, W] -> stages -> global average pool [B, channels[-1]] -> Dropout -> Linear [B, C].
    The global pool makes the head independent of the input resolution.
    """

    def __init__(
        self,
        input_shape: Shape,
        num_classes: Annotated[int, AtLeast(1)],
        channels: Annotated[Sequence[int], Widths] = (32, 64),
        dropout: Annotated[float, Probability] = 0.1,
        init: InitScheme = "default",
    ) -> None:
        super().__init__()
        check_arguments(SmallCNN.__init__, locals())
        shape = check_shape(input_shape)
        if len(shape) != 3:
            raise ConfigError("input_shape", list(shape), "a CNN needs [channels, height, width]")
        self.save_hyperparameters()
        layers: list[nn.Module] = []
        c_in, size = shape[0], min(shape[1:])
        for c_out in channels:
            for conv_in in (c_in, c_out):
                # No conv bias: BatchNorm's shift makes it redundant.
                layers += [nn.Conv2d(conv_in, c_out, 3, padding=1, bias=False),
                           nn.BatchNorm2d(c_out), nn.ReLU(inplace=True)]  # fmt: skip
            if size > 1:
                layers.append(nn.MaxPool2d(2))
                size //= 2
            c_in = c_out
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(c_in, num_classes)
        )
        init_weights(self, init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
