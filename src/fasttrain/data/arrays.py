"""In-memory data sets from two arrays: a subclass says where (x, y) come from, this does the rest.

    class WineDataModule(ArrayDataModule):
        def load_arrays(self):
            return sklearn.datasets.load_wine(return_X_y=True)   # x [178, 13], y [178]

with `num_classes: 3` and `input_shape: [13]` in its conf/data/*.yaml. The split is stratified
and fixed by `seed`; inputs are standardised with statistics of the training split only, one
mean/std per feature (tabular data) or one for all values (pixels).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from sklearn.model_selection import train_test_split
from torch.utils.data import TensorDataset

from fasttrain.config.errors import ConfigError, check_shape
from fasttrain.data.base import TensorDataModule
from fasttrain.data.folds import check_folds, fold_indices

Standardize = Literal["per_feature", "global", "none"]


class ArrayDataModule(TensorDataModule):
    """Base for data sets given as arrays x [N, *input_shape] and integer labels y [N].

    Args:
        num_classes: labels are 0..num_classes-1 (checked against the data).
        input_shape: the shape of one sample; x is reshaped to it (checked against the data).
        standardize: "per_feature" (each feature its own mean/std: tabular data), "global" (one
            mean/std: pixels) or "none"; always from the training split, so nothing leaks.
        val_fraction, test_fraction, seed, **loader: as TensorDataModule.
        num_folds, fold: k-fold cross-validation (fasttrain.data.folds): with `fold` set, train
            on the other folds of the train+val pool and validate on fold `fold`; null: off.
    """

    def __init__(
        self,
        num_classes: int,
        input_shape: Sequence[int],
        standardize: Standardize = "per_feature",
        val_fraction: float = 0.15,
        test_fraction: float = 0.2,
        seed: int = 42,
        num_folds: int = 5,
        fold: int | None = None,
        **loader: Any,
    ) -> None:
        super().__init__(
            val_fraction=val_fraction, test_fraction=test_fraction, seed=seed, **loader
        )
        check_folds(num_folds, fold)
        self.num_folds, self.fold = num_folds, fold
        if num_classes < 2:
            raise ConfigError("num_classes", num_classes, "expected an int >= 2")
        if standardize not in ("per_feature", "global", "none"):
            raise ConfigError(
                "standardize", standardize, "expected one of 'per_feature', 'global', 'none'"
            )
        self.num_classes = num_classes
        self.input_shape = check_shape(input_shape)
        self.standardize = standardize
        self.save_hyperparameters()

    def load_arrays(self) -> tuple[Any, Any]:
        """(x [N, ...] numbers, y [N] integer labels): the one method a subclass writes."""
        raise NotImplementedError

    def make_splits(self) -> dict[str, TensorDataset]:
        x, y = self.load_arrays()
        x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)  # [N, features]
        y = self._checked_labels(np.asarray(y), len(x))
        if x.shape[1] != int(np.prod(self.input_shape)):
            raise ConfigError(
                "input_shape", list(self.input_shape), f"samples have {x.shape[1]} values"
            )
        if self.fold is not None:
            train, val, test = fold_indices(y, self.num_folds, self.fold, self.test_fraction,
                                            self.seed)  # fmt: skip
            x_train, x_val, x_test = x[train], x[val], x[test]
            y_train, y_val, y_test = y[train], y[val], y[test]
        else:
            holdout = self.val_fraction + self.test_fraction
            x_train, x_rest, y_train, y_rest = train_test_split(
                x, y, test_size=holdout, stratify=y, random_state=self.seed
            )
            x_val, x_test, y_val, y_test = train_test_split(
                x_rest, y_rest, test_size=self.test_fraction / holdout, stratify=y_rest,
                random_state=self.seed,
            )  # fmt: skip
        mean, std = self._statistics(x_train)
        self.mean, self.std = mean, std  # [features] or scalars: input_statistics() shapes them
        return {
            name: TensorDataset(
                torch.as_tensor((xs - mean) / std, dtype=torch.float32).view(-1, *self.input_shape),
                torch.as_tensor(ys, dtype=torch.long),
            )
            for name, xs, ys in (
                ("train", x_train, y_train), ("val", x_val, y_val), ("test", x_test, y_test)
            )
        }  # fmt: skip

    def input_statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) of the training split, float32, each a scalar or [*input_shape]: the net
        takes (raw - mean) / std. Exports carry them, so a deployment feeds raw inputs."""
        self.setup()
        return self._shaped(self.mean), self._shaped(self.std)

    def _shaped(self, value: Any) -> torch.Tensor:
        tensor = torch.as_tensor(np.asarray(value), dtype=torch.float32)
        return tensor.reshape(self.input_shape) if tensor.numel() > 1 else tensor

    def _checked_labels(self, y: np.ndarray, n: int) -> np.ndarray:
        if y.shape != (n,) or y.dtype.kind not in "iu":
            raise ConfigError("num_classes", self.num_classes, f"labels are {y.dtype} {y.shape}")
        if y.min() < 0 or y.max() >= self.num_classes:
            raise ConfigError(
                "num_classes",
                self.num_classes,
                f"labels span {y.min()}..{y.max()}; expected >= {y.max() + 1}",
            )
        return y

    def _statistics(self, x_train: np.ndarray) -> tuple[Any, Any]:
        """Mean and std of the training split ([features] or scalars); std 0 -> 1 (a constant
        feature is centred, not divided by zero)."""
        if self.standardize == "none":
            return 0.0, 1.0
        axis = 0 if self.standardize == "per_feature" else None
        mean, std = x_train.mean(axis=axis), x_train.std(axis=axis)
        return mean, np.where(std > 0, std, 1.0)
