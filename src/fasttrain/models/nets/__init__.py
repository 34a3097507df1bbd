"""Plain nn.Modules. Each records its constructor arguments (`net.hparams`), so a checkpoint can
rebuild it from plain values without unpickling code."""

from fasttrain.models.nets.cnn import SmallCNN
from fasttrain.models.nets.gpt import GPT
from fasttrain.models.nets.init import INIT_SCHEMES, init_weights
from fasttrain.models.nets.mlp import MLP
from fasttrain.models.nets.resnet import ResNet

__all__ = ["GPT", "INIT_SCHEMES", "MLP", "ResNet", "SmallCNN", "init_weights"]
