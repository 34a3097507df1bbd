"""Predict: predictions.csv for the test split (CLI) and for an .npy file; bad .npy files fail
with one line and leave nothing behind."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from conftest import CONF, run_cli, run_dirs
from fasttrain.assemble.restore import restore
from fasttrain.config.errors import UserError
from fasttrain.deploy.predict import load_inputs
from fasttrain.tasks import predict


def predict_cfg(ckpt: Path, tmp_path: Path, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("predict", overrides=[
            f"ckpt_path={ckpt}", f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path}/run",
            "data.num_workers=0", *overrides,
        ])  # fmt: skip


@pytest.fixture(scope="module")
def test_split(mlp_ckpt: Path, tmp_path_factory: pytest.TempPathFactory):
    """(test inputs, labels, the eager net's logits on them)."""
    model, datamodule = restore(predict_cfg(mlp_ckpt, tmp_path_factory.mktemp("cfg")))
    x, y = datamodule.test_dataloader().dataset.tensors
    with torch.no_grad():
        return x, y, model.net.eval()(x)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # 10-15 s of processes: CI runs it in make test-slow
def test_cli_predicts_the_test_split(mlp_ckpt: Path, test_split, tmp_path: Path) -> None:
    x, y, logits = test_split
    proc = run_cli(["-m", "fasttrain.predict", f"ckpt_path={mlp_ckpt}", "data.num_workers=0"],
                   tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = run_dirs(tmp_path, "predict")
    rows = read_csv(run / "predictions.csv")
    probs_of = [f"prob_{i}" for i in range(10)]
    assert list(rows[0]) == ["index", "pred", "class", "prob", *probs_of, "label"]
    assert len(rows) == len(x)
    assert [int(r["index"]) for r in rows] == list(range(len(x)))
    assert [int(r["pred"]) for r in rows] == logits.argmax(1).tolist()
    assert [int(r["label"]) for r in rows] == y.tolist()
    probs = torch.tensor([float(r["prob"]) for r in rows])
    assert torch.allclose(probs, logits.softmax(1).max(1).values, atol=1e-5)
    every = torch.tensor([[float(r[c]) for c in probs_of] for r in rows])
    assert torch.allclose(every, logits.softmax(1), atol=1e-5)
    accuracy = (logits.argmax(1) == y).float().mean().item()
    assert accuracy > 0.8 and f"accuracy {accuracy:.4f}" in proc.stdout


def test_predict_an_npy_file(mlp_ckpt: Path, test_split, tmp_path: Path) -> None:
    x, _, logits = test_split
    # input= takes raw inputs, as the exported files do: the test split's pixels unstandardised
    mean, std = restore(predict_cfg(mlp_ckpt, tmp_path))[1].input_statistics()
    raw = (x[:10] * std + mean).numpy().astype(np.float64)  # any numeric dtype works
    np.save(tmp_path / "x.npy", raw)
    out = predict(predict_cfg(mlp_ckpt, tmp_path, f"input={tmp_path}/x.npy",
                              f"output_dir={tmp_path}/out"))  # fmt: skip
    assert out == tmp_path / "out" / "predictions.csv"
    rows = read_csv(out)
    assert list(rows[0])[:4] == ["index", "pred", "class", "prob"] and len(rows) == 10
    assert "label" not in rows[0]  # no labels: no column
    assert [int(r["pred"]) for r in rows] == logits[:10].argmax(1).tolist()


def test_cli_wrong_shape_npy_is_one_line_and_writes_nothing(mlp_ckpt: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "flat.npy", np.zeros((5, 64), dtype=np.float32))  # flattened digits
    proc = run_cli(["-m", "fasttrain.predict", f"ckpt_path={mlp_ckpt}",
                    f"input={tmp_path}/flat.npy"], tmp_path / "logs")  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr == (f"error: input={tmp_path}/flat.npy: shape [5, 64] does not fit the "
                           "net: expected [N, 1, 8, 8]\n")  # fmt: skip
    assert run_dirs(tmp_path / "logs", "predict") == []
    assert not list((tmp_path / "logs").rglob("predictions.csv"))


def _npz(path: Path) -> None:
    """An .npz archive under the name given (np.savez would add .npz)."""
    with path.open("wb") as f:
        np.savez(f, x=np.zeros((2, 1, 8, 8)))


@pytest.mark.parametrize(
    ("write", "message"),
    [
        (None, "no such file"),
        (lambda p: p.mkdir(), r"is a folder; expected an \.npy file"),
        (lambda p: p.write_text("index,pred\n0,1\n"), r"not a readable \.npy array"),
        (lambda p: np.save(p, np.array([{"a": 1}], dtype=object)), r"not a readable \.npy array"),
        (lambda p: np.save(p, np.zeros((0, 1, 8, 8))), "holds no samples"),
        (lambda p: np.save(p, np.full((2, 1, 8, 8), "x")), r"dtype <U1 is not numeric"),
        (lambda p: np.save(p, _with(2, np.nan)), r"row 2 holds NaN or inf"),
        (lambda p: np.save(p, _with(1, -np.inf)), r"row 1 holds NaN or inf"),
        # finite in the file, inf as float32: named as such, not as NaN or inf
        (lambda p: np.save(p, _with(3, 1e39)), r"row 3 holds a value beyond float32's range"),
        # numpy's own message for these advises allow_pickle=True, i.e. running the file's code
        (_npz, r"not a readable \.npy array \(an \.npz archive"),
        (lambda p: p.write_text("1,2,3\n"), r"not a readable \.npy array \(not an \.npy file"),
    ],
    ids=[
        "missing",
        "a-folder",
        "not-npy",
        "pickled-objects",
        "empty",
        "strings",
        "nan",
        "inf",
        "beyond-float32",
        "npz",
        "csv",
    ],
)
def test_bad_npy_files_are_named(write, message: str, tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    if write:
        write(path)
    with pytest.raises(UserError, match=f"^input={re.escape(str(path))}: {message}"):
        load_inputs(path, (1, 8, 8))


@pytest.mark.parametrize("dtype", [">f4", ">f8", ">i2", "<f2", "?", "u1"])
def test_any_numeric_npy_is_read_as_float32(dtype: str, tmp_path: Path) -> None:
    # A big-endian file (written on another machine, or by MATLAB/Java tools) made
    # torch.as_tensor raise ValueError: a traceback, exit 1 and a run folder left behind.
    x = (np.arange(2 * 64).reshape(2, 1, 8, 8) % 2).astype(dtype)
    np.save(tmp_path / "x.npy", x)
    loaded = load_inputs(tmp_path / "x.npy", (1, 8, 8))
    assert loaded.dtype == torch.float32
    assert torch.equal(loaded, torch.tensor(x.astype(np.float32)))


def _with(row: int, value: float) -> np.ndarray:
    x = np.zeros((4, 1, 8, 8))
    x[row, 0, 3, 3] = value
    return x
