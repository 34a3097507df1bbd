"""Random tensors of any shape and class count: benchmarks without disk or downloads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import TensorDataset

from fasttrain.config.errors import ConfigError, check_shape
from fasttrain.data.base import TensorDataModule


class SyntheticDataModule(TensorDataModule):
    """Gaussian inputs labelled by a fixed random linear map, so a model can actually learn them.

    Shapes: x [num_samples, *input_shape] float32, y [num_samples] int64 in [0, num_classes).
    `loader` takes the loading knobs of TensorDataModule (batch_size, num_workers, ...).
    """

    def __init__(
        self,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        seed: int = 42,
        num_samples: int = 4096,
        num_classes: int = 10,
        input_shape: Sequence[int] = (3, 32, 32),
        **loader: Any,
    ) -> None:
        super().__init__(
            val_fraction=val_fraction, test_fraction=test_fraction, seed=seed, **loader
        )
        if num_samples < 3:
            raise ConfigError("num_samples", num_samples, "expected an int >= 3 (one per split)")
        if num_classes < 2:
            raise ConfigError("num_classes", num_classes, "expected an int >= 2")
        self.num_samples, self.num_classes = num_samples, num_classes
        self.input_shape = check_shape(input_shape)
        self.save_hyperparameters()

    def input_statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """No preprocessing: the Gaussian inputs are what the net takes (mean 0, std 1)."""
        return torch.zeros(()), torch.ones(())

    def make_splits(self) -> dict[str, TensorDataset]:
        gen = torch.Generator().manual_seed(self.seed)
        x = torch.randn(self.num_samples, *self.input_shape, generator=gen)
        proj = torch.randn(x[0].numel(), self.num_classes, generator=gen)
        y = (x.flatten(1) @ proj).argmax(dim=1)
        n_val = max(1, int(self.num_samples * self.val_fraction))
        n_test = max(1, int(self.num_samples * self.test_fraction))
        n_train = self.num_samples - n_val - n_test
        bounds = {"train": (0, n_train), "val": (n_train, n_train + n_val),
                  "test": (n_train + n_val, self.num_samples)}  # fmt: skip
        return {name: TensorDataset(x[a:b], y[a:b]) for name, (a, b) in bounds.items()}
