"""fasttrain: a PyTorch Lightning + Hydra template for training models fast on GPUs.

Importing the package is cheap on purpose: torch and Lightning load only when a task runs, so
`python train.py --help` answers in well under a second.
"""

__version__ = "0.3.0"  # the project's version (pyproject.toml); CHANGELOG.md says what changed

from importlib import import_module
from typing import Any

# The public API: what a project's own code may import, as `from fasttrain import Task`. These
# names keep their meaning across versions (CHANGELOG.md announces any change); everything
# else is internal and may move. Loaded on first use, so `import fasttrain` stays cheap.
PUBLIC = {
    # tasks: LightningModules on one contract; Task is the base a project's own task extends
    "Task": "fasttrain.models.task",
    "Classifier": "fasttrain.models.classifier",
    "Regressor": "fasttrain.models.regressor",
    "LanguageModel": "fasttrain.models.language_model",
    "WarmupCosine": "fasttrain.models.schedules",
    # nets: plain nn.Modules that record their arguments (a checkpoint rebuilds them)
    "MLP": "fasttrain.models.nets.mlp",
    "SmallCNN": "fasttrain.models.nets.cnn",
    "ResNet": "fasttrain.models.nets.resnet",
    "GPT": "fasttrain.models.nets.gpt",
    "init_weights": "fasttrain.models.nets.init",
    # data modules: the bases a project's own data set extends, and the data sets by name
    "TensorDataModule": "fasttrain.data.base",
    "ArrayDataModule": "fasttrain.data.arrays",
    "RegressionArrayDataModule": "fasttrain.data.regression",
    "ImageDataModule": "fasttrain.data.images",
    "ImageFolderDataModule": "fasttrain.data.image_folder",
    "Cifar10DataModule": "fasttrain.data.cifar10",
    "NpyDataModule": "fasttrain.data.npy",
    "ShardsDataModule": "fasttrain.data.shards",
    "TextDataModule": "fasttrain.data.text",
    "DigitsDataModule": "fasttrain.data.digits",
    "WineDataModule": "fasttrain.data.wine",
    "DiabetesDataModule": "fasttrain.data.diabetes",
    "SyntheticDataModule": "fasttrain.data.synthetic",
    # what export and predict need of a plain LightningModule (typing.Protocol: write the methods)
    "Exportable": "fasttrain.models.protocols",
    "Predictable": "fasttrain.models.protocols",
    # one-line errors: raise them for input a user can fix (exit code 2, nothing written)
    "UserError": "fasttrain.config.errors",
    "ConfigError": "fasttrain.config.errors",
    # value rules declared in a signature: `lr: Annotated[float, LearningRate]`, checked at
    # config time and, with check_arguments(Cls.__init__, locals()), when built in Python
    "Range": "fasttrain.config.domains",
    "AtLeast": "fasttrain.config.domains",
    "Positive": "fasttrain.config.domains",
    "NonNegative": "fasttrain.config.domains",
    "Probability": "fasttrain.config.domains",
    "OpenUnit": "fasttrain.config.domains",
    "LearningRate": "fasttrain.config.domains",
    "Folder": "fasttrain.config.domains",  # `out: Annotated[str, Folder()]`: a folder to write to
    "check_arguments": "fasttrain.config.domains",
    # a project's entry modules: `main, run = entry_points("train", tasks.train)`
    "entry_points": "fasttrain.cli",
    # the project's conf/ folder the entry points read (FASTTRAIN_CONF, or found from the cwd)
    "CONFIG_DIR": "fasttrain.config.project",
}
__all__ = ["__version__", *PUBLIC]


def __getattr__(name: str) -> Any:
    if name not in PUBLIC:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(PUBLIC[name]), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *PUBLIC})
