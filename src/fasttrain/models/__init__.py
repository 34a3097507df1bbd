"""LightningModules (task logic); plain nn.Module nets live in fasttrain.models.nets."""

from fasttrain.models.classifier import Classifier

__all__ = ["Classifier"]
