"""scikit-learn's wine: 178 samples of 13 chemical measurements, 3 cultivars (offline, tabular).

The whole of a new in-memory data set: where the arrays come from. Splitting, per-feature
standardisation and loading come from ArrayDataModule; shapes and labels from conf/data/wine.yaml.
"""

from __future__ import annotations

from typing import Any

from sklearn.datasets import load_wine

from fasttrain.data.arrays import ArrayDataModule


class WineDataModule(ArrayDataModule):
    def load_arrays(self) -> tuple[Any, Any]:
        return load_wine(return_X_y=True)  # x [178, 13] floats, y [178] in 0..2
