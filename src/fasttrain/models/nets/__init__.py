"""Plain nn.Modules. Each records its constructor arguments (`net.hparams`), so a checkpoint can
rebuild it from plain values without unpickling code.

Each net is a battery: imported when first named (`_target_: fasttrain.models.nets.MLP`), so a
CNN's run never imports the GPT.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fasttrain.models.nets.cnn import SmallCNN
    from fasttrain.models.nets.gpt import GPT
    from fasttrain.models.nets.init import INIT_SCHEMES, init_weights
    from fasttrain.models.nets.mlp import MLP
    from fasttrain.models.nets.resnet import ResNet

_WHERE = {
    "GPT": "fasttrain.models.nets.gpt",
    "INIT_SCHEMES": "fasttrain.models.nets.init",
    "MLP": "fasttrain.models.nets.mlp",
    "ResNet": "fasttrain.models.nets.resnet",
    "SmallCNN": "fasttrain.models.nets.cnn",
    "init_weights": "fasttrain.models.nets.init",
}
__all__ = ["GPT", "INIT_SCHEMES", "MLP", "ResNet", "SmallCNN", "init_weights"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
