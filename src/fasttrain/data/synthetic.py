"""Random tensors of any shape and class count: benchmarks without disk or downloads."""

from __future__ import annotations

from typing import Annotated, Any

import torch
from torch.utils.data import TensorDataset

from fasttrain.config.domains import AtLeast, Shape, check_arguments
from fasttrain.config.errors import ConfigError
from fasttrain.data.base import Classes, Fraction, Seed, TensorDataModule, floor_sizes
from fasttrain.data.checks import fewest_rows, meets


class SyntheticDataModule(TensorDataModule):
    """Gaussian inputs labelled by a fixed random linear map, so a model can actually learn them.

    Shapes: x [num_samples, *input_shape] float32, y [num_samples] int64 in [0, num_classes).
    `loader` takes the loading knobs of TensorDataModule (batch_size, num_workers, ...).
    """

    def __init__(
        self,
        val_fraction: Fraction = 0.1,
        test_fraction: Fraction = 0.1,
        seed: Seed = 42,
        num_samples: Annotated[int, AtLeast(3, note="one in each split")] = 4096,
        num_classes: Classes = 10,
        input_shape: Shape = (3, 32, 32),
        **loader: Any,
    ) -> None:
        super().__init__(
            val_fraction=val_fraction, test_fraction=test_fraction, seed=seed, **loader
        )
        check_arguments(SyntheticDataModule.__init__, locals())
        # one row in each split: large fractions need more than 3 rows (0.9 and 0.05 need 11)
        sizes = floor_sizes(val_fraction, test_fraction)
        if not meets(sizes, (1, 1, 1), num_samples):  # the config alone tells: refused at once
            least = fewest_rows(sizes, (1, 1, 1))
            raise ConfigError(
                "num_samples", num_samples,
                f"data.val_fraction={val_fraction} and data.test_fraction={test_fraction} need "
                f"at least {least} (one in each split)",
            )  # fmt: skip
        self.num_samples, self.num_classes = num_samples, num_classes
        self.input_shape = tuple(input_shape)
        self.save_hyperparameters()

    def input_statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """No preprocessing: the Gaussian inputs are what the net takes (mean 0, std 1)."""
        return torch.zeros(()), torch.ones(())

    def make_splits(self) -> dict[str, TensorDataset]:
        gen = torch.Generator().manual_seed(self.seed)
        x = torch.randn(self.num_samples, *self.input_shape, generator=gen)
        proj = torch.randn(x[0].numel(), self.num_classes, generator=gen)
        y = (x.flatten(1) @ proj).argmax(dim=1)
        # Gaussian x: always finite, nothing for fasttrain.data.checks to refuse.
        n_train, n_val, _ = floor_sizes(self.val_fraction, self.test_fraction)(self.num_samples)
        bounds = {"train": (0, n_train), "val": (n_train, n_train + n_val),
                  "test": (n_train + n_val, self.num_samples)}  # fmt: skip
        return {name: TensorDataset(x[a:b], y[a:b]) for name, (a, b) in bounds.items()}
