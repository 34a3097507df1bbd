"""LightningDataModules: the offline digits set and synthetic tensors for benchmarks."""

from fasttrain.data.base import TensorDataModule, resolve_num_workers, resolve_pin_memory
from fasttrain.data.digits import DigitsDataModule
from fasttrain.data.synthetic import SyntheticDataModule

__all__ = [
    "DigitsDataModule",
    "SyntheticDataModule",
    "TensorDataModule",
    "resolve_num_workers",
    "resolve_pin_memory",
]
