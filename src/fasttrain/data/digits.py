"""scikit-learn's digits: 1,797 real 8x8 handwritten digits that ship with the library (offline)."""

from __future__ import annotations

from typing import Annotated, Any

from sklearn.datasets import load_digits

from fasttrain.config.domains import AtLeast, Shape, check_arguments
from fasttrain.config.errors import ConfigError
from fasttrain.data.arrays import ArrayDataModule, Standardize
from fasttrain.data.base import Fraction, Seed

DIGITS_SHAPE = (1, 8, 8)
DIGITS_CLASSES = 10
# more than 10 is allowed (classes the data never shows); fewer cannot hold its labels
DigitClasses = Annotated[int, AtLeast(DIGITS_CLASSES, note="digits has labels 0..9")]


class DigitsDataModule(ArrayDataModule):
    """Digits split train/val/test, stratified and fixed by `seed`, standardised with one
    mean/std of the training split (pixels share a scale).

    `num_classes` and `input_shape` are arguments (not constants) so that the model config can
    interpolate them from here, the one source of truth; they are checked against the data.
    """

    def __init__(
        self,
        val_fraction: Fraction = 0.15,
        test_fraction: Fraction = 0.2,
        seed: Seed = 42,
        num_classes: DigitClasses = DIGITS_CLASSES,
        input_shape: Shape = DIGITS_SHAPE,
        standardize: Standardize = "global",
        **loader: Any,
    ) -> None:
        # checked now, not when the data loads inside fit()
        check_arguments(DigitsDataModule.__init__, locals())
        if tuple(input_shape) != DIGITS_SHAPE:
            raise ConfigError("input_shape", list(input_shape), f"digits are {list(DIGITS_SHAPE)}")
        super().__init__(
            num_classes, input_shape, standardize, val_fraction, test_fraction, seed, **loader
        )

    @property
    def class_names(self) -> list[str]:
        """Label i is the digit i (predictions.csv names its columns prob_0 .. prob_9)."""
        return [str(i) for i in range(self.num_classes)]

    def load_arrays(self) -> tuple[Any, Any]:
        return load_digits(return_X_y=True)  # x [1797, 64] in 0..16, y [1797]
