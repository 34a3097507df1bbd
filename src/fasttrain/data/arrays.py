"""In-memory data sets from two arrays: a subclass says where (x, y) come from, this does the rest.
ArrayDataModule takes class labels; fasttrain.data.regression real-valued targets.

    class WineDataModule(ArrayDataModule):
        def load_arrays(self):
            return sklearn.datasets.load_wine(return_X_y=True)   # x [178, 13], y [178]

with `num_classes: 3` and `input_shape: [13]` in its conf/data/*.yaml. The split is stratified
and fixed by `seed`; inputs are standardised with statistics of the training split only, one
mean/std per feature (tabular data) or one for all values (pixels).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch
from torch.utils.data import TensorDataset

from fasttrain.config.domains import Shape, check_arguments
from fasttrain.config.errors import ConfigError
from fasttrain.data.base import (
    Classes,
    Fold,
    Fraction,
    NumFolds,
    Seed,
    TensorDataModule,
    check_folds,
)
from fasttrain.data.checks import (
    Sizes,
    check_class_sizes,
    check_finite,
    check_rows,
    needs_text,
)

Standardize = Literal["per_feature", "global", "none"]


def shuffle_sizes(val_fraction: float, test_fraction: float) -> Sizes:
    """rows -> (train, val, test) rows of ArraySplits' split: val and test together round up,
    then test within them, as scikit-learn rounds a float test_size (ceil)."""

    def sizes(rows: int) -> tuple[int, int, int]:
        holdout = val_fraction + test_fraction
        rest = math.ceil(holdout * rows)
        test = math.ceil(test_fraction / holdout * rest)
        return rows - rest, rest - test, test

    return sizes


class ArraySplits(TensorDataModule):
    """What every in-memory array data set shares: the split fixed by `seed` (or a k-fold fold),
    standardised inputs, and the loaders. ArrayDataModule (class labels) and
    RegressionArrayDataModule (real-valued targets) say what y holds.

    Args:
        input_shape: the shape of one sample; x is reshaped to it (checked against the data).
        standardize: "per_feature" (each feature its own mean/std: tabular data), "global" (one
            mean/std: pixels) or "none"; always from the training split, so nothing leaks.
        val_fraction, test_fraction, seed, **loader: as TensorDataModule.
        num_folds, fold: k-fold cross-validation (fasttrain.data.folds): with `fold` set, train
            on the other folds of the train+val pool and validate on fold `fold`; null: off.
    """

    stratified = True  # splits keep the proportions of y's values (class labels)

    def __init__(
        self,
        input_shape: Shape,
        standardize: Standardize = "per_feature",
        val_fraction: Fraction = 0.15,
        test_fraction: Fraction = 0.2,
        seed: Seed = 42,
        num_folds: NumFolds = 5,
        fold: Fold = None,
        **loader: Any,
    ) -> None:
        super().__init__(
            val_fraction=val_fraction, test_fraction=test_fraction, seed=seed, **loader
        )
        check_arguments(ArraySplits.__init__, locals())
        check_folds(num_folds, fold)
        self.num_folds, self.fold = num_folds, fold
        self.input_shape = tuple(input_shape)
        self.standardize = standardize

    def load_arrays(self) -> tuple[Any, Any]:
        """(x [N, ...] numbers, y [N] (or [N, targets])): the one method a subclass writes."""
        raise NotImplementedError

    def checked_targets(self, y: np.ndarray, n: int) -> torch.Tensor:
        """y as the tensor the model takes, after checking it against the config."""
        raise NotImplementedError

    def make_splits(self) -> dict[str, TensorDataset]:
        x, y = self.load_arrays()
        x = np.asarray(x, dtype=np.float64)  # [N, ...] as loaded: a NaN's place reads as given
        check_finite(x, self.source(), "the features")
        x = x.reshape(len(x), -1)  # [N, features]
        targets = self.checked_targets(np.asarray(y), len(x))
        if x.shape[1] != int(np.prod(self.input_shape)):
            raise ConfigError(
                "input_shape", list(self.input_shape), f"samples have {x.shape[1]} values"
            )
        self.check_rows(targets.numpy())
        train, val, test = self._split_rows(targets.numpy())
        mean, std = self._statistics(x[train])
        self.mean, self.std = mean, std  # [features] or scalars: input_statistics() shapes them
        self.fit_targets(targets[train])
        return {
            name: TensorDataset(
                torch.as_tensor((x[rows] - mean) / std, dtype=torch.float32).view(
                    -1, *self.input_shape
                ),
                targets[rows],
            )
            for name, rows in (("train", train), ("val", val), ("test", test))
        }

    def fit_targets(self, train_targets: torch.Tensor) -> None:
        """Statistics of the training split's targets, for a subclass that keeps any."""

    def check_rows(self, y: np.ndarray) -> None:
        """Enough rows for the split (fasttrain.data.checks): every held-out split at least
        `held_out_rows`, one to train; stratified, every split at least one row per class (as
        scikit-learn demands) and every class two rows. y: [N] labels or [N, targets]."""
        classes = len(np.unique(y)) if self.stratified else 0
        least = max(self.held_out_rows, classes)
        need = (max(1, classes), least, least)
        why = needs_text(need) + (f": one per class of {classes}" if self.stratified else "")
        if self.fold is None:
            sizes = shuffle_sizes(self.val_fraction, self.test_fraction)
            asked = (
                f"data.val_fraction={self.val_fraction} and data.test_fraction={self.test_fraction}"
            )
        else:
            from fasttrain.data.folds import fold_sizes  # k-fold's battery: only with data.fold

            sizes = fold_sizes(self.num_folds, self.test_fraction)
            asked = f"data.num_folds={self.num_folds} and data.test_fraction={self.test_fraction}"
        check_rows(len(y), sizes, need, self.source(), asked, why)
        if self.stratified:
            check_class_sizes(y, self.source())

    def _split_rows(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(train, val, test) row indices, fixed by seed; stratified by y for class labels. The
        held-out counts are shuffle_sizes' (as scikit-learn's own rounding of the fractions)."""
        from sklearn.model_selection import train_test_split  # ~0.4 s: only where it splits

        if self.fold is not None:
            from fasttrain.data.folds import fold_indices

            return fold_indices(y, self.num_folds, self.fold, self.test_fraction, self.seed,
                                stratify=self.stratified)  # fmt: skip
        _, n_val, n_test = shuffle_sizes(self.val_fraction, self.test_fraction)(len(y))
        train, rest = train_test_split(np.arange(len(y)), test_size=n_val + n_test,
                                       random_state=self.seed,
                                       stratify=y if self.stratified else None)  # fmt: skip
        if self.stratified:  # a class with one row among the held-out ones cannot be split
            check_class_sizes(y[rest], self.source(), f" among the {len(rest)} held out")
        val, test = train_test_split(rest, test_size=n_test, random_state=self.seed,
                                     stratify=y[rest] if self.stratified else None)  # fmt: skip
        return train, val, test

    def input_statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) of the training split, float32, each a scalar or [*input_shape]: the net
        takes (raw - mean) / std. Exports carry them, so a deployment feeds raw inputs."""
        self.setup()
        return self._shaped(self.mean), self._shaped(self.std)

    def _shaped(self, value: Any) -> torch.Tensor:
        tensor = torch.as_tensor(np.asarray(value), dtype=torch.float32)
        return tensor.reshape(self.input_shape) if tensor.numel() > 1 else tensor

    def _statistics(self, x_train: np.ndarray) -> tuple[Any, Any]:
        """Mean and std of the training split ([features] or scalars); std 0 -> 1 (a constant
        feature is centred, not divided by zero)."""
        if self.standardize == "none":
            return 0.0, 1.0
        axis = 0 if self.standardize == "per_feature" else None
        mean, std = x_train.mean(axis=axis), x_train.std(axis=axis)
        return mean, np.where(std > 0, std, 1.0)


class ArrayDataModule(ArraySplits):
    """Base for data sets given as arrays x [N, *input_shape] and integer labels y [N]; the split
    is stratified.

    Args:
        num_classes: labels are 0..num_classes-1 (checked against the data).
        the rest: as ArraySplits.
    """

    def __init__(
        self,
        num_classes: Classes,
        input_shape: Shape,
        standardize: Standardize = "per_feature",
        val_fraction: Fraction = 0.15,
        test_fraction: Fraction = 0.2,
        seed: Seed = 42,
        num_folds: NumFolds = 5,
        fold: Fold = None,
        **loader: Any,
    ) -> None:
        super().__init__(input_shape, standardize, val_fraction, test_fraction, seed, num_folds,
                         fold, **loader)  # fmt: skip
        check_arguments(ArrayDataModule.__init__, locals())
        self.num_classes = num_classes
        self.save_hyperparameters()

    def checked_targets(self, y: np.ndarray, n: int) -> torch.Tensor:
        return torch.as_tensor(self._checked_labels(y, n), dtype=torch.long)

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
