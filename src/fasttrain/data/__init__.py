"""LightningDataModules. Configs name each by its module path (fasttrain.data.wine.WineDataModule),
so a new data set needs no edit here."""

from fasttrain.data.arrays import ArrayDataModule
from fasttrain.data.base import TensorDataModule, resolve_num_workers, resolve_pin_memory
from fasttrain.data.digits import DigitsDataModule
from fasttrain.data.synthetic import SyntheticDataModule

__all__ = [
    "ArrayDataModule",
    "DigitsDataModule",
    "SyntheticDataModule",
    "TensorDataModule",
    "resolve_num_workers",
    "resolve_pin_memory",
]
