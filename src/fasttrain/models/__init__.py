"""LightningModules (task logic) on one contract (fasttrain.models.task.Task); plain nn.Module
nets live in fasttrain.models.nets."""

from fasttrain.models.classifier import Classifier
from fasttrain.models.regressor import Regressor
from fasttrain.models.task import Task

__all__ = ["Classifier", "Regressor", "Task"]
