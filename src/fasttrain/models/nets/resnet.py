"""A CIFAR-style ResNet (basic blocks): the standard conv workload for GPU throughput.

ResNet-18 is `blocks=[2, 2, 2, 2]`, `channels=[64, 128, 256, 512]` (the defaults); a smaller one
trains digits in seconds. The stem is a 3x3 conv without pooling, so 8x8 and 32x32 inputs work.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import torch
from lightning.pytorch.core.mixins import HyperparametersMixin
from torch import nn

from fasttrain.config.domains import AtLeast, Shape, check_arguments
from fasttrain.config.errors import ConfigError, check_shape
from fasttrain.models.nets.init import InitScheme, Widths, init_weights


def conv_bn(c_in: int, c_out: int, stride: int = 1, kernel: int = 3) -> nn.Sequential:
    # No conv bias: BatchNorm's shift makes it redundant.
    pad = kernel // 2
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, kernel, stride=stride, padding=pad, bias=False),
        nn.BatchNorm2d(c_out),
    )


class BasicBlock(nn.Module):
    """x -> conv-bn-relu -> conv-bn, plus x (1x1 conv-bn when the shape changes) -> relu."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            conv_bn(c_in, c_out, stride), nn.ReLU(inplace=True), conv_bn(c_out, c_out)
        )
        self.skip = (
            nn.Identity() if stride == 1 and c_in == c_out else conv_bn(c_in, c_out, stride, 1)
        )
        self.act = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.body(x) + self.skip(x))


class ResNet(HyperparametersMixin, nn.Module):
    """[B, C, H, W] -> stem -> stages (stride 2 after the first) -> global pool -> [B, classes]."""

    def __init__(
        self,
        input_shape: Shape,
        num_classes: Annotated[int, AtLeast(1)],
        channels: Annotated[Sequence[int], Widths] = (64, 128, 256, 512),
        blocks: Annotated[Sequence[int], AtLeast(1, what="counts")] = (2, 2, 2, 2),
        init: InitScheme = "kaiming",
    ) -> None:
        super().__init__()
        check_arguments(ResNet.__init__, locals())
        shape = check_shape(input_shape)
        if len(shape) != 3:
            raise ConfigError(
                "input_shape", list(shape), "a ResNet needs [channels, height, width]"
            )
        if len(channels) != len(blocks):
            raise ConfigError(
                "blocks", list(blocks), "expected one count >= 1 per entry of channels"
            )
        self.save_hyperparameters()
        layers: list[nn.Module] = [conv_bn(shape[0], channels[0]), nn.ReLU(inplace=True)]
        c_in = channels[0]
        for stage, (c_out, n) in enumerate(zip(channels, blocks, strict=True)):
            for i in range(n):
                layers.append(BasicBlock(c_in, c_out, stride=2 if stage > 0 and i == 0 else 1))
                c_in = c_out
        self.features = nn.Sequential(*layers)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes)
        )
        init_weights(self, init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))
