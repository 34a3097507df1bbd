"""LightningModules (task logic) on one contract (fasttrain.models.task.Task); plain nn.Module
nets live in fasttrain.models.nets.

Each task is a battery: imported when first named (a config's `_target_:
fasttrain.models.Classifier`, or `from fasttrain.models import Classifier`), so a classifier's
run never imports the language model and its optimizers.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fasttrain.models.classifier import Classifier
    from fasttrain.models.language_model import LanguageModel
    from fasttrain.models.regressor import Regressor
    from fasttrain.models.task import Task

_WHERE = {
    "Classifier": "fasttrain.models.classifier",
    "LanguageModel": "fasttrain.models.language_model",
    "Regressor": "fasttrain.models.regressor",
    "Task": "fasttrain.models.task",
}
__all__ = ["Classifier", "LanguageModel", "Regressor", "Task"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
