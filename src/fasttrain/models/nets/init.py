"""Weight initialisation schemes selectable by `init=` on every net."""

from __future__ import annotations

from typing import Literal, get_args

from torch import nn

from fasttrain.config.domains import AtLeast
from fasttrain.config.errors import ConfigError

InitScheme = Literal["default", "kaiming", "xavier"]
# The widths of a net's layers (channels, hidden sizes): a non-empty list of ints >= 1.
Widths = AtLeast(1, what="a non-empty list of ints")
INIT_SCHEMES: tuple[str, ...] = get_args(InitScheme)


def init_weights(net: nn.Module, scheme: InitScheme) -> None:
    """Re-initialise conv and linear layers in place.

    "kaiming" (He) keeps activation variance constant through ReLU stacks, which is what keeps
    gradients from vanishing in deep ReLU nets; "xavier" suits tanh/sigmoid; "default" keeps
    PyTorch's own init. Biases start at zero for both non-default schemes.
    """
    if scheme not in INIT_SCHEMES:
        raise ConfigError("init", scheme, f"expected one of {', '.join(INIT_SCHEMES)}")
    if scheme == "default":
        return
    for module in net.modules():
        if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
            if scheme == "kaiming":
                nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
            else:
                nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
