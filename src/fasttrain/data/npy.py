"""Arrays on disk: `<path>/x.npy` (samples) and `<path>/y.npy` (integer labels).

Everything that can be wrong with the files is checked when the module is built, before a run
starts: missing or unreadable files, sample shape against `input_shape`, dtypes, lengths, labels
against `num_classes`, and enough rows for the splits. Only the headers and the labels are read
then (x is memory-mapped). NaN or inf in a float x.npy is refused when x is read, at setup
(before the trainer exists: TensorDataModule.prepare_before_trainer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    floor_sizes,
)
from fasttrain.data.checks import check_class_sizes, check_finite_served, check_rows, needs_text
from fasttrain.data.folds import fold_indices, fold_sizes


class NpyDataModule(TensorDataModule):
    """x.npy: float or uint8 [N, *input_shape] (uint8 is scaled to [0, 1]); y.npy: int [N] in
    [0, num_classes). Split at random into train/val/test, fixed by `seed`; with `fold` set,
    into stratified folds instead (`num_folds`, `fold`: as ArrayDataModule).

    `loader` takes the loading knobs of TensorDataModule (batch_size, num_workers, ...).
    """

    def __init__(
        self,
        path: str,
        num_classes: Classes,
        input_shape: Shape,
        val_fraction: Fraction = 0.1,
        test_fraction: Fraction = 0.1,
        seed: Seed = 42,
        num_folds: NumFolds = 5,
        fold: Fold = None,
        **loader: Any,
    ) -> None:
        super().__init__(
            val_fraction=val_fraction, test_fraction=test_fraction, seed=seed, **loader
        )
        check_arguments(NpyDataModule.__init__, locals())
        check_folds(num_folds, fold)
        self.num_folds, self.fold = num_folds, fold
        self.path, self.num_classes = Path(path), num_classes
        self.input_shape = tuple(input_shape)
        x, y = self._open("x"), self._open("y")
        # float128 (long double) too: torch has no such type, and failed to convert it at setup
        if x.dtype not in (np.float16, np.float32, np.float64, np.uint8):
            raise ConfigError("path", path, f"x.npy holds {x.dtype}; expected float or uint8 "
                              "(float16, float32 or float64)")  # fmt: skip
        if tuple(x.shape[1:]) != self.input_shape:
            raise ConfigError(
                "input_shape",
                list(input_shape),
                f"x.npy holds samples of shape {list(x.shape[1:])}",
            )
        if y.ndim != 1 or y.dtype.kind not in "iu":
            raise ConfigError(
                "path", path, f"y.npy holds {y.dtype} {list(y.shape)}; expected 1-D integer labels"
            )
        if len(y) != len(x) or len(x) == 0:
            raise ConfigError(
                "path", path, f"x.npy has {len(x)} samples, y.npy {len(y)}; expected equal, >= 1"
            )
        low, high = int(y.min()), int(y.max())
        if low < 0 or high >= num_classes:
            raise ConfigError(
                "num_classes", num_classes,
                f"y.npy labels span {low}..{high}; expected 0..{num_classes - 1}",
            )  # fmt: skip
        self.check_rows(np.asarray(y))
        self.save_hyperparameters()

    def source(self) -> str:
        return f"data.path={self.path}"

    def check_rows(self, y: np.ndarray) -> None:
        """Enough rows for the split, from the labels alone (fasttrain.data.checks): one row in
        each held-out split and one to train; the stratified folds (`fold` set) also one of each
        class in every split and two rows of each class."""
        if self.fold is None:
            asked = (
                f"data.val_fraction={self.val_fraction} and data.test_fraction={self.test_fraction}"
            )
            sizes, need = floor_sizes(self.val_fraction, self.test_fraction), (1, 1, 1)
            check_rows(len(y), sizes, need, self.source(), asked, needs_text(need))
            return
        classes = len(np.unique(y))
        asked = f"data.num_folds={self.num_folds} and data.test_fraction={self.test_fraction}"
        need = (classes, classes, classes)
        why = f"{needs_text(need)}: one per class of {classes}"
        check_rows(len(y), fold_sizes(self.num_folds, self.test_fraction), need, self.source(),
                   asked, why)  # fmt: skip
        check_class_sizes(y, self.source())

    def input_statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) with net input = (raw - mean) / std: uint8 x.npy is scaled to [0, 1]
        (std 255), float x.npy goes in as it is. Exports carry them: they take x.npy's values."""
        scale = 255.0 if self._open("x").dtype == np.uint8 else 1.0
        return torch.zeros(()), torch.tensor(scale)

    def _open(self, name: str) -> np.ndarray:
        file = self.path / f"{name}.npy"
        if not file.is_file():
            raise ConfigError(
                "path", str(self.path), f"no {name}.npy there (expected x.npy, y.npy)"
            )
        try:  # no pickles: a .npy of objects could run code
            return np.load(file, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError) as err:
            raise ConfigError(
                "path", str(self.path), f"{name}.npy is not readable ({err})"
            ) from None

    def make_splits(self) -> dict[str, TensorDataset]:
        x, y = np.load(self.path / "x.npy"), np.load(self.path / "y.npy")
        xs = torch.as_tensor(x, dtype=torch.float32) / (255.0 if x.dtype == np.uint8 else 1.0)
        if x.dtype.kind == "f":  # uint8 pixels and integer labels cannot be NaN or inf
            check_finite_served(x, xs.numpy(), self.source(), "x.npy")  # [N, *input_shape]
        ys = torch.as_tensor(y, dtype=torch.long)
        if self.fold is not None:  # stratified k-fold (fasttrain.data.folds)
            rows = fold_indices(y, self.num_folds, self.fold, self.test_fraction, self.seed)
            parts = tuple(torch.as_tensor(r) for r in rows)
        else:
            order = torch.randperm(len(xs), generator=torch.Generator().manual_seed(self.seed))
            sizes = floor_sizes(self.val_fraction, self.test_fraction)(len(xs))
            parts = order.split(list(sizes))
        return {name: TensorDataset(xs[idx], ys[idx]) for name, idx in
                zip(("train", "val", "test"), parts, strict=True)}  # fmt: skip
