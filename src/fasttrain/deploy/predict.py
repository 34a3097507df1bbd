"""Class predictions for a batch stream: inputs from an .npy file or a data module's split."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from fasttrain.config.errors import UserError
from fasttrain.deploy.files import atomic_path
from fasttrain.deploy.formats import Runner


def load_inputs(path: str | Path, input_shape: Sequence[int], key: str = "input") -> torch.Tensor:
    """An .npy of inputs [N, *input_shape] -> float32 tensor; one UserError per way it fails."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"{key}={path}: no such file")
    try:
        # allow_pickle=False: an object array would run code from the file on load.
        array = np.load(file, allow_pickle=False)
    except Exception as err:
        raise UserError(f"{key}={path}: not a readable .npy array ({err})") from None
    expected = [*input_shape]
    if not isinstance(array, np.ndarray) or list(array.shape[1:]) != expected:
        shape = list(getattr(array, "shape", []))
        raise UserError(f"{key}={path}: shape {shape} does not fit the net: expected [N, "
                        f"{', '.join(map(str, expected))}]")  # fmt: skip
    if len(array) == 0:
        raise UserError(f"{key}={path}: holds no samples")
    if array.dtype.kind not in "biuf":
        raise UserError(f"{key}={path}: dtype {array.dtype} is not numeric")
    return torch.as_tensor(array, dtype=torch.float32)


def predict(
    run: Runner, batches: Iterable[tuple[torch.Tensor, torch.Tensor | None]]
) -> Iterator[tuple[list[float], int | None]]:
    """(softmax probability of every class, label or None) per sample, in order."""
    for x, y in batches:
        probs = run(x).softmax(dim=1)
        labels = y.tolist() if y is not None else [None] * len(x)
        yield from zip(probs.tolist(), labels, strict=True)


def write_predictions(
    path: Path, rows: Iterable[tuple[list[float], int | None]], class_names: Sequence[str]
) -> dict[str, float]:
    """predictions.csv: index (the sample's row in the inputs), pred (class index), class (its
    name), prob (its probability), prob_<name> for every class, and label with labelled inputs.

    Returns {"samples": N} and, with labels, {"accuracy": ...}.
    """
    rows = list(rows)
    labelled = bool(rows) and rows[0][1] is not None
    header = ["index", "pred", "class", "prob", *(f"prob_{n}" for n in class_names)]
    correct = 0
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*header, *(["label"] if labelled else [])])
        for i, (probs, label) in enumerate(rows):
            pred = max(range(len(probs)), key=probs.__getitem__)
            correct += pred == label
            shown = [f"{p:.6f}" for p in probs]
            writer.writerow([i, pred, class_names[pred], shown[pred], *shown,
                             *([label] if labelled else [])])  # fmt: skip
    summary: dict[str, float] = {"samples": len(rows)}
    if labelled:
        summary["accuracy"] = correct / len(rows)
    return summary
