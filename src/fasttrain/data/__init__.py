"""LightningDataModules. Configs name each by its module path (fasttrain.data.wine.WineDataModule),
so a new data set needs no edit here.

The names below are imported when first used: importing one module of this package (the loaders
every run uses) must not import scikit-learn for data sets the run does not read.
"""

from importlib import import_module
from typing import Any

_WHERE = {
    "ArrayDataModule": "fasttrain.data.arrays",
    "DigitsDataModule": "fasttrain.data.digits",
    "SyntheticDataModule": "fasttrain.data.synthetic",
    "TensorDataModule": "fasttrain.data.base",
    "resolve_num_workers": "fasttrain.data.base",
    "resolve_pin_memory": "fasttrain.data.base",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
