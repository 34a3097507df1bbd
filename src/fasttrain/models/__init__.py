"""LightningModules (task logic) on one contract (fasttrain.models.task.Task); plain nn.Module
nets live in fasttrain.models.nets."""

from fasttrain.models.classifier import Classifier
from fasttrain.models.language_model import LanguageModel
from fasttrain.models.regressor import Regressor
from fasttrain.models.task import Task

__all__ = ["Classifier", "LanguageModel", "Regressor", "Task"]
