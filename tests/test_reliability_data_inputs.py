"""In-memory data that cannot train is refused at setup in one line, before the trainer exists:
too few rows for the splits the fractions (or folds) cut, with the minimum derived from them, and
NaN or inf in features or targets, with the count and the first place.

All but one build the data module in this process (well under a second each); the last runs the
command line once: exit code 2, one `error:` line, no checkpoint."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from conftest import REPO, run_cli
from fasttrain.config.errors import UserError
from fasttrain.data.arrays import ArrayDataModule
from fasttrain.data.regression import RegressionArrayDataModule


class FileRegression(RegressionArrayDataModule):
    """A user's regression data set: x.npy [N, 4] features and y.npy [N] or [N, T] targets."""

    def __init__(self, folder: Path, num_targets: int = 1, **kwargs: Any) -> None:
        self.folder = folder
        super().__init__(num_targets=num_targets, input_shape=[4], **kwargs)

    def load_arrays(self) -> tuple[Any, Any]:
        return np.load(self.folder / "x.npy"), np.load(self.folder / "y.npy")


class FileLabels(ArrayDataModule):
    """The same with class labels y.npy [N] in 0..2 (stratified split)."""

    def __init__(self, folder: Path, **kwargs: Any) -> None:
        self.folder = folder
        super().__init__(num_classes=3, input_shape=[4], **kwargs)

    def load_arrays(self) -> tuple[Any, Any]:
        return np.load(self.folder / "x.npy"), np.load(self.folder / "y.npy")


def arrays(folder: Path, rows: int, targets: int = 0, x: np.ndarray | None = None) -> Path:
    """x.npy [rows, 4] Gaussian (or `x`), y.npy: [rows] labels 0..2 (targets=0), else targets
    [rows] (1) or [rows, targets]."""
    gen = np.random.default_rng(rows)
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "x.npy", gen.normal(size=(rows, 4)) if x is None else x)
    shape = (rows,) if targets <= 1 else (rows, targets)
    y = np.arange(rows) % 3 if targets == 0 else gen.normal(size=shape)
    np.save(folder / "y.npy", y)
    return folder


def least_rows(message: str) -> int:
    found = re.search(r"need at least (\d+) rows", message)
    assert found, message
    return int(found.group(1))


@pytest.mark.parametrize(
    "split",
    [
        {"val_fraction": 0.1, "test_fraction": 0.1},
        {"val_fraction": 0.3, "test_fraction": 0.05},
        {"fold": 0, "num_folds": 5, "test_fraction": 0.2},
    ],
    ids=["fractions", "small-test", "folds"],
)
def test_a_regression_too_small_for_its_splits_is_refused_with_the_least_rows_that_work(
    split: dict[str, Any], tmp_path: Path
) -> None:
    """Three rows used to reach torchmetrics' "Needs at least two samples" (R^2 of a held-out
    split of one row) or scikit-learn's empty-split ValueError. The minimum given is exact: it
    sets up, with every held-out split scored by R^2; one row fewer is refused."""
    from torchmetrics import R2Score

    with pytest.raises(UserError) as refused:
        FileRegression(arrays(tmp_path / "3", 3, targets=1), **split).setup()
    line = str(refused.value)
    assert "\n" not in line and line.startswith("FileRegression: 3 rows, but data.")
    assert "2 in each held-out split" in line
    least = least_rows(line)
    with pytest.raises(UserError, match=f"need at least {least} rows"):
        FileRegression(arrays(tmp_path / "less", least - 1, targets=1), **split).setup()
    enough = FileRegression(arrays(tmp_path / "least", least, targets=1), **split)
    enough.setup()
    for name in ("val", "test"):
        y = enough.splits[name].tensors[1][:, 0]
        assert torch.isfinite(R2Score()(y.flip(0), y))


def test_a_built_in_data_set_cut_too_thin_names_itself_before_training(tmp_path: Path) -> None:
    """diabetes (442 rows) with data.test_fraction=0.002 held out one test row: the run trained
    to the end and then crashed on the test split's R^2."""
    from fasttrain.data.diabetes import DiabetesDataModule

    data = DiabetesDataModule(num_targets=1, input_shape=[10], val_fraction=0.2,
                              test_fraction=0.002)  # fmt: skip
    with pytest.raises(UserError) as refused:
        data.setup()
    line = str(refused.value)
    assert line.startswith("DiabetesDataModule: 442 rows, but data.val_fraction=0.2 and ")
    assert "data.test_fraction=0.002 need at least 501 rows" in line
    assert "352/89/1 train/val/test" in line


def test_a_stratified_split_with_fewer_held_out_rows_than_classes_is_one_line(
    tmp_path: Path,
) -> None:
    """Stratified, each split needs one row per class (scikit-learn's own demand): 20 rows of 3
    classes at 0.1/0.1 held out 2 test rows and crashed in train_test_split."""
    with pytest.raises(UserError) as refused:
        FileLabels(arrays(tmp_path, 20), val_fraction=0.1, test_fraction=0.1).setup()
    line = str(refused.value)
    assert "3 in each held-out split, 3 to train: one per class of 3" in line
    least = least_rows(line)
    FileLabels(arrays(tmp_path / "least", least), val_fraction=0.1, test_fraction=0.1).setup()


def test_npy_folds_too_small_for_the_classes_are_refused_when_the_module_is_built(
    tmp_path: Path,
) -> None:
    """data=npy with data.fold: the labels alone tell, so the constructor refuses (it runs
    before Hydra writes anything); 83 rows of 10 classes held out 9 test rows and crashed in
    scikit-learn at setup."""
    from fasttrain.data.npy import NpyDataModule

    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "x.npy", np.zeros((83, 1, 8, 8), np.float32))
    np.save(folder / "y.npy", np.arange(83) % 10)
    with pytest.raises(UserError) as refused:
        NpyDataModule(str(folder), num_classes=10, input_shape=[1, 8, 8], fold=0)
    line = str(refused.value)
    assert line.startswith(f"data.path={folder}: 83 rows, but data.num_folds=5 and ")
    assert "need at least 91 rows" in line and "one per class of 10" in line


def nan_at(rows: int, where: tuple[int, ...], shape: tuple[int, ...] = (4,)) -> np.ndarray:
    x = np.random.default_rng(0).normal(size=(rows, *shape))
    x[where] = np.nan
    return x


def test_non_finite_regression_features_are_counted_and_the_first_is_named(
    tmp_path: Path,
) -> None:
    x = nan_at(50, (17, 2))
    x[20, 1], x[30, 0] = np.inf, -np.inf
    with pytest.raises(UserError) as refused:
        FileRegression(arrays(tmp_path, 50, targets=1, x=x)).setup()
    assert str(refused.value) == (
        "FileRegression: 3 non-finite values (NaN or inf) in the features, the first at row 17, "
        "column 2; clean or impute them first"
    )


def test_non_finite_targets_and_class_features_are_refused(tmp_path: Path) -> None:
    """Targets: the old message blamed data.num_targets and missed a float64 value that float32
    holds as inf; class-label features went unchecked."""
    folder = arrays(tmp_path / "targets", 50, targets=2)
    y = np.load(folder / "y.npy")
    y[7, 1] = np.nan
    np.save(folder / "y.npy", y)
    with pytest.raises(UserError, match=r"1 non-finite value \(NaN or inf\) in the targets, "
                                        r"the first at row 7, column 1"):  # fmt: skip
        FileRegression(folder, num_targets=2).setup()
    np.save(folder / "y.npy", np.where(np.isnan(y), 1e39, y))  # finite, but not in float32
    with pytest.raises(UserError, match=r"in the targets once cast to float32 .*row 7, column 1"):
        FileRegression(folder, num_targets=2).setup()
    with pytest.raises(UserError, match="in the features, the first at row 5, column 0"):
        FileLabels(arrays(tmp_path / "labels", 60, x=nan_at(60, (5, 0)))).setup()


def npy_with_nan(folder: Path) -> Path:
    """60 8x8 float32 samples of 10 classes, one NaN at sample 17, pixel (0, 0, 2)."""
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "x.npy", nan_at(60, (17, 0, 0, 2), (1, 8, 8)).astype(np.float32))
    np.save(folder / "y.npy", np.arange(60) % 10)
    return folder


def test_a_nan_in_npy_is_refused_while_the_run_is_built_before_the_trainer(
    tmp_path: Path,
) -> None:
    """build_run (the train task's) loads and checks the arrays before the trainer, its loggers
    and callbacks exist: nothing of the run is written by then. It used to train on NaN."""
    from practices import build_run, compose_train

    folder = npy_with_nan(tmp_path / "npy")
    cfg = compose_train(tmp_path, "data=npy", f"data.path={folder}")
    with pytest.raises(UserError) as refused:
        build_run(cfg)
    assert str(refused.value) == (
        f"data.path={folder}: 1 non-finite value (NaN or inf) in x.npy, the first at row 17, "
        "position (0, 0, 2); clean or impute them first"
    )


@pytest.mark.slow  # a process to its refusal, ~15 s on 2 cores; in-process tests cover the rest
def test_the_command_line_exits_2_with_one_line_and_no_checkpoint(tmp_path: Path) -> None:
    """It used to finish (exit 0) with val/loss nan, a best checkpoint and next commands."""
    folder = npy_with_nan(tmp_path / "npy")
    args = [str(REPO / "train.py"), "data=npy", f"data.path={folder}", "trainer.max_epochs=1"]
    proc = run_cli(args, tmp_path / "logs")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors == [lines[-1]] and "Traceback" not in proc.stderr
    assert "non-finite value (NaN or inf) in x.npy, the first at row 17" in errors[0]
    assert not list((tmp_path / "logs").rglob("*.ckpt"))
    assert not list((tmp_path / "logs").rglob("config.yaml")), "a run folder was left behind"
