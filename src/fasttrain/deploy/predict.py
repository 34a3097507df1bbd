"""A task's predictions for a batch stream: inputs from an .npy file or a data module's split."""

from __future__ import annotations

import contextlib
import csv
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fasttrain.config.errors import UserError
from fasttrain.deploy.files import atomic_path
from fasttrain.deploy.formats import Runner


def check_input_task(ckpt_path: str | Path, path: str | Path) -> None:
    """input= is an array of features; a language model (its checkpoint keeps a tokenizer) reads
    text, and predict generates with prompt= instead: refused before its data is read or built.
    The peek maps the file (mmap): no tensor is read; a file it cannot map is read later, and
    refused there if it must be."""
    from fasttrain.models.language_model import TOKENIZER_KEY

    try:
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return
    if isinstance(ckpt, dict) and TOKENIZER_KEY in ckpt:
        raise UserError(
            f"input={path}: ckpt_path={ckpt_path} is a language model's checkpoint, which "
            "takes no .npy file; generate text with prompt='def ' instead"
        )


def load_inputs(path: str | Path, input_shape: Sequence[int], key: str = "input") -> torch.Tensor:
    """An .npy of inputs [N, *input_shape] -> float32 tensor; one UserError per way it fails."""
    file = Path(path)
    if not file.is_file():
        what = "is a folder; expected an .npy file" if file.is_dir() else "no such file"
        raise UserError(f"{key}={path}: {what}")
    array = _read_npy(file, f"{key}={path}")
    expected = [*input_shape]
    if list(array.shape[1:]) != expected:
        raise UserError(f"{key}={path}: shape {list(array.shape)} does not fit the net: expected "
                        f"[N, {', '.join(map(str, expected))}]")  # fmt: skip
    if len(array) == 0:
        raise UserError(f"{key}={path}: holds no samples")
    if array.dtype.kind not in "biuf":
        raise UserError(f"{key}={path}: dtype {array.dtype} is not numeric")
    return _finite_float32(array, f"{key}={path}")


NPY_MAGIC, ZIP_MAGIC = b"\x93NUMPY", b"PK\x03\x04"  # np.save's header; np.savez's (a zip)


def _read_npy(file: Path, what: str) -> np.ndarray:
    """The one array an .npy file holds. numpy reads an .npz (a zip) as an archive, and calls
    any other file pickled data, suggesting allow_pickle: both are named here instead."""
    with file.open("rb") as f:
        magic = f.read(len(NPY_MAGIC))
    if magic != NPY_MAGIC:
        kind = "an .npz archive" if magic.startswith(ZIP_MAGIC) else "not an .npy file"
        raise UserError(f"{what}: not a readable .npy array ({kind}; write one array with "
                        "np.save(path, x))")  # fmt: skip
    try:
        # allow_pickle=False: an object array would run code from the file on load.
        return np.load(file, allow_pickle=False)
    except Exception as err:
        raise UserError(f"{what}: not a readable .npy array ({err})") from None


def _finite_float32(array: np.ndarray, what: str) -> torch.Tensor:
    """float32 in native byte order (torch reads no big-endian array); a NaN or inf input gives
    NaN outputs (a classifier then names class 0), so a row holding one is refused, as is a
    finite value beyond float32's range, which would become inf."""
    with np.errstate(over="ignore"):
        x = array.astype(np.float32)
    bad = np.flatnonzero(~np.isfinite(x.reshape(len(x), -1)).all(axis=1))
    if len(bad):
        row = int(bad[0])
        why = "holds NaN or inf"
        if np.isfinite(array[row]).all():  # finite in the file, inf once float32
            why = f"holds a value beyond float32's range (±{np.finfo(np.float32).max:.1e})"
        raise UserError(f"{what}: row {row} {why} ({len(bad)} rows in all); "
                        "predictions need finite float32 inputs")  # fmt: skip
    return torch.from_numpy(x)


def predict(
    run: Runner, batches: Iterable[tuple[torch.Tensor, torch.Tensor | None]]
) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
    """(outputs in the task's units, labels or None) per batch, in order."""
    for x, y in batches:
        yield run(x), y


def write_predictions(
    path: Path, batches: Iterable[tuple[torch.Tensor, torch.Tensor | None]], task: Any,
    datamodule: Any,
) -> dict[str, float]:  # fmt: skip
    """predictions.csv: index (the sample's row in the inputs), the task's columns
    (`prediction_header`: pred, class, prob, prob_<name> for a classifier; pred_<target> for a
    regressor), and with labelled inputs the label (label_0, label_1, ... for several values).

    Returns {"samples": N} and, with labels, the task's score over them ({"accuracy": ...}).
    """
    name, score = task.score()
    header, labelled, count = task.prediction_header(datamodule), False, 0
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        for i, (outputs, y) in enumerate(batches):
            rows = task.prediction_rows(outputs, datamodule)
            labels = [[]] * len(rows) if y is None else y.reshape(len(rows), -1).tolist()
            if i == 0:
                labelled = y is not None
                width = len(labels[0]) if labelled else 0
                label_names = ["label"] if width == 1 else [f"label_{k}" for k in range(width)]
                writer.writerow(["index", *header, *label_names])
            if y is not None:
                score.update(outputs, y)
            writer.writerows([count + k, *row, *label] for k, (row, label)
                             in enumerate(zip(rows, labels, strict=True)))  # fmt: skip
            count += len(rows)
        if count == 0:
            writer.writerow(["index", *header])
    summary: dict[str, float] = {"samples": count}
    if labelled and count:
        with contextlib.suppress(ValueError):  # undefined on these rows (R^2 of one sample)
            summary[name] = float(score.compute())
    return summary
