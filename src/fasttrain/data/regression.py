"""In-memory regression data: arrays x [N, *input_shape] and real-valued targets y [N] or
[N, num_targets]. A subclass says where they come from (`load_arrays`), as for class labels:

    class DiabetesDataModule(RegressionArrayDataModule):
        def load_arrays(self):
            return sklearn.datasets.load_diabetes(return_X_y=True)   # x [442, 10], y [442]

Targets are served in their own units, float32 [N, num_targets]; `target_statistics()` gives
their training-split mean and std, which a regression task standardises them with on the device
(and records in its checkpoint, so predictions and exported files come out in these units).
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
import torch

from fasttrain.config.domains import AtLeast, Shape, check_arguments
from fasttrain.config.errors import ConfigError
from fasttrain.data.arrays import ArraySplits, Standardize
from fasttrain.data.base import Fold, Fraction, NumFolds, Seed
from fasttrain.data.checks import check_finite_served


class RegressionArrayDataModule(ArraySplits):
    """Arrays with real-valued targets; the split is a plain shuffle fixed by `seed`.

    Args:
        num_targets: values predicted per sample (checked against the data).
        the rest: as fasttrain.data.arrays.ArraySplits.
    """

    stratified = False
    held_out_rows = 2  # R^2 (the regressor's val/r2, test/r2) is undefined on one sample

    def __init__(
        self,
        num_targets: Annotated[int, AtLeast(1)],
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
        check_arguments(RegressionArrayDataModule.__init__, locals())
        self.num_targets = num_targets
        self.save_hyperparameters()

    def checked_targets(self, y: np.ndarray, n: int) -> torch.Tensor:
        """y [N] or [N, num_targets] numbers, all finite -> float32 [N, num_targets]."""
        if y.dtype.kind not in "biuf" or len(y) != n:
            raise ConfigError("num_targets", self.num_targets,
                              f"targets are {y.dtype} {list(y.shape)} for {n} samples")  # fmt: skip
        with np.errstate(over="ignore"):  # beyond float32's range: refused just below
            served = y.astype(np.float32)  # y [N] or [N, targets], as given
        check_finite_served(y, served, self.source(), "the targets")
        y = served.reshape(n, -1)
        if y.shape[1] != self.num_targets:
            raise ConfigError(
                "num_targets", self.num_targets, f"the data has {y.shape[1]} targets per sample"
            )
        return torch.as_tensor(y)

    def fit_targets(self, train_targets: torch.Tensor) -> None:
        # float64 for the statistics; a constant target is centred, not divided by zero.
        std = train_targets.double().std(dim=0, correction=0)
        self.target_mean = train_targets.double().mean(dim=0).float()
        self.target_std = torch.where(std > 0, std, torch.ones_like(std)).float()

    def target_statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) [num_targets] of the training split's targets, float32."""
        self.setup()
        return self.target_mean, self.target_std
