"""scikit-learn's diabetes: 442 patients, 10 baseline measurements, and a measure of disease
progression one year later to predict (offline, tabular regression).

The whole of a new regression data set: where the arrays come from. Splitting, per-feature
standardisation and loading come from RegressionArrayDataModule; shapes from
conf/data/diabetes.yaml.
"""

from __future__ import annotations

from typing import Any

from sklearn.datasets import load_diabetes

from fasttrain.data.regression import RegressionArrayDataModule


class DiabetesDataModule(RegressionArrayDataModule):
    def load_arrays(self) -> tuple[Any, Any]:
        # scaled=False: the raw measurements (age in years, BMI, ...), so that exported files
        # and `predict input=` take the values a clinic records.
        return load_diabetes(return_X_y=True, scaled=False)  # x [442, 10], y [442] in 25..346
