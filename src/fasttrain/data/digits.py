"""scikit-learn's digits: 1,797 real 8x8 handwritten digits that ship with the library (offline)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch.utils.data import TensorDataset

from fasttrain.config.errors import ConfigError, check_shape
from fasttrain.data.base import TensorDataModule

DIGITS_SHAPE = (1, 8, 8)
DIGITS_CLASSES = 10


class DigitsDataModule(TensorDataModule):
    """Digits split train/val/test, stratified and fixed by `seed`, standardised with train stats.

    `loader` takes the loading knobs of TensorDataModule (batch_size, num_workers, ...).

    `num_classes` and `input_shape` are arguments (not constants) so that the model config can
    interpolate them from here, the one source of truth; they are checked against the data.
    """

    def __init__(
        self,
        val_fraction: float = 0.15,
        test_fraction: float = 0.2,
        seed: int = 42,
        num_classes: int = 10,
        input_shape: Sequence[int] = DIGITS_SHAPE,
        **loader: Any,
    ) -> None:
        super().__init__(
            val_fraction=val_fraction, test_fraction=test_fraction, seed=seed, **loader
        )
        if check_shape(input_shape) != DIGITS_SHAPE:
            raise ConfigError("input_shape", list(input_shape), f"digits are {list(DIGITS_SHAPE)}")
        if num_classes < DIGITS_CLASSES:  # checked now, not when the data loads inside fit()
            raise ConfigError(
                "num_classes", num_classes, f"digits has labels 0..9; expected >= {DIGITS_CLASSES}"
            )
        self.num_classes = num_classes
        self.input_shape = DIGITS_SHAPE
        self.save_hyperparameters()

    def make_splits(self) -> dict[str, TensorDataset]:
        x, y = load_digits(return_X_y=True)
        if y.max() >= self.num_classes or y.min() < 0:
            raise ConfigError(
                "num_classes",
                self.num_classes,
                f"labels span 0..{y.max()}; expected >= {y.max() + 1}",
            )
        holdout = self.val_fraction + self.test_fraction
        x_train, x_rest, y_train, y_rest = train_test_split(
            x, y, test_size=holdout, stratify=y, random_state=self.seed
        )
        x_val, x_test, y_val, y_test = train_test_split(
            x_rest, y_rest, test_size=self.test_fraction / holdout, stratify=y_rest,
            random_state=self.seed,
        )  # fmt: skip
        # One mean/std from the training split only, so no statistic leaks from val/test.
        mean, std = x_train.mean(), x_train.std()

        def to_tensors(xs, ys) -> TensorDataset:
            xs = torch.as_tensor((xs - mean) / std, dtype=torch.float32).view(-1, *DIGITS_SHAPE)
            return TensorDataset(xs, torch.as_tensor(ys, dtype=torch.long))

        return {
            "train": to_tensors(x_train, y_train),
            "val": to_tensors(x_val, y_val),
            "test": to_tensors(x_test, y_test),
        }
