"""The run's hyperparameters, next to its final metrics, in TensorBoard's HPARAMS tab."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"model": {"optimizer": {"lr": 1e-3}}} -> {"model.optimizer.lr": 1e-3}.

    Only scalars (numbers, strings, booleans) are kept: the HPARAMS tab filters and sorts on
    them. A list (e.g. layer widths) becomes its string, a null the string "None".
    """
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def log_hparams(loggers: list[Any], params: Any, metrics: Mapping[str, float]) -> None:
    """Write `params` (nested, resolved) once with the run's final `metrics` to every
    TensorBoard logger; other loggers keep what Lightning already records for them."""
    flat = flatten(params)
    # Under hp/: Lightning writes these as scalars too, and a second `val/acc` point would
    # distort the training curve of the same name.
    final = {f"hp/{k}": float(v) for k, v in metrics.items() if k.startswith(("val/", "test/"))}
    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            # rank-zero only inside Lightning's logger; the metrics become the tab's columns.
            logger.log_hyperparams(flat, final)
            logger.finalize("success")
