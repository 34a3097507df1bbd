"""k-fold cross-validation splits: the test split is held out once, the rest cut into K folds.

    python train.py data.fold=2                     fold 2 of data.num_folds (5): train on the
                                                    other four folds, validate on fold 2
    python train.py -m data.fold='range(5)'         all five; the sweep ends with cv_summary.json

Class labels are stratified (each split keeps the class proportions) and fixed by `seed`. The test
split is the same rows in every fold, so the folds' test metrics measure one thing; the folds
partition the remaining train+val pool, each row validated in exactly one fold. `val_fraction`
plays no part: a fold validates on 1/K of the pool.
"""

from __future__ import annotations

import math

import numpy as np
from sklearn.model_selection import KFold, StratifiedKFold, train_test_split

from fasttrain.config.errors import UserError
from fasttrain.data.checks import Sizes


def fold_sizes(num_folds: int, test_fraction: float) -> Sizes:
    """rows -> the smallest (train, val, test) rows of any fold: test rounds up (as scikit-learn
    rounds a float test_size); the pool's folds differ by one row at most, so the smallest
    validation fold holds pool // K rows and the smallest training part pool - ceil(pool / K)."""

    def sizes(rows: int) -> tuple[int, int, int]:
        test = math.ceil(test_fraction * rows)
        pool = rows - test
        return pool - -(-pool // num_folds), pool // num_folds, test

    return sizes


def fold_indices(
    y: np.ndarray,
    num_folds: int,
    fold: int,
    test_fraction: float,
    seed: int,
    stratify: bool = True,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(train, val, test) row indices into y [N] for fold `fold` of `num_folds`; `stratify`:
    by y's classes (real-valued targets: plain shuffled folds)."""
    rows = np.arange(len(y))
    n_test = fold_sizes(num_folds, test_fraction)(len(y))[2]
    pool, test = train_test_split(rows, test_size=n_test, stratify=y if stratify else None,
                                  random_state=seed)  # fmt: skip
    if not stratify:
        if len(pool) < num_folds:
            raise UserError(f"data.num_folds={num_folds}: the train+val pool has {len(pool)} "
                            "samples, fewer than one per fold; use fewer folds")  # fmt: skip
        train, val = list(KFold(num_folds, shuffle=True, random_state=seed).split(pool))[fold]
        return pool[train], pool[val], test
    _, counts = np.unique(y[pool], return_counts=True)
    if counts.min() < num_folds:
        # Raised while the data loads, outside the builder that prefixes `data.`: named here.
        raise UserError(
            f"data.num_folds={num_folds}: the smallest class has {counts.min()} samples in the "
            f"train+val pool ({len(pool)} samples), fewer than one per fold; use fewer folds"
        )
    folds = StratifiedKFold(n_splits=num_folds, shuffle=True, random_state=seed)
    train, val = list(folds.split(pool, y[pool]))[fold]
    return pool[train], pool[val], test
