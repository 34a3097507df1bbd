"""Plain nn.Modules. Each records its constructor arguments (`net.hparams`), so a checkpoint can
rebuild it from plain values without unpickling code."""

from fasttrain.models.nets.cnn import SmallCNN
from fasttrain.models.nets.init import INIT_SCHEMES, init_weights
from fasttrain.models.nets.mlp import MLP

__all__ = ["INIT_SCHEMES", "MLP", "SmallCNN", "init_weights"]
