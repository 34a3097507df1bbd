"""Run-level speed and tuning knobs the train entry applies: matmul precision and Lightning's
tuner (LR finder, batch-size finder). Values come from the top level of conf/train.yaml."""

from __future__ import annotations

from typing import Any

from fasttrain.errors import UserError

MATMUL_PRECISIONS = ("highest", "high", "medium")
BATCH_SIZE_MODES = ("power", "binsearch")


def set_matmul_precision(value: str | None) -> None:
    """float32 matmuls: "highest" exact fp32; "high" TF32 on Tensor Cores (~8x the fp32 rate on
    Ampere+, 10-bit mantissa); "medium" bf16 internally. Null keeps torch's default."""
    if value is None:
        return
    if value not in MATMUL_PRECISIONS:
        raise UserError(
            f"matmul_precision={value!r}: expected one of {', '.join(MATMUL_PRECISIONS)}"
        )
    import torch

    torch.set_float32_matmul_precision(value)


def check_tuner(lr_find: bool = False, batch_size: str | None = None) -> None:
    if not isinstance(lr_find, bool):
        raise UserError(f"tuner.lr_find={lr_find!r}: expected true or false")
    if batch_size is not None and batch_size not in BATCH_SIZE_MODES:
        choices = ", ".join(BATCH_SIZE_MODES)
        raise UserError(f"tuner.batch_size={batch_size!r}: expected one of {choices} or null")


def tune(trainer: Any, model: Any, datamodule: Any, lr_find: bool = False,
         batch_size: str | None = None) -> None:  # fmt: skip
    """Before fit: grow `datamodule.batch_size` until it no longer fits (mode `batch_size`), then
    run the LR range test, whose suggestion becomes `model.lr` (used by configure_optimizers)."""
    check_tuner(lr_find, batch_size)
    if not lr_find and batch_size is None:
        return
    from lightning.pytorch.tuner import Tuner

    tuner = Tuner(trainer)
    if batch_size is not None:
        tuner.scale_batch_size(model, datamodule=datamodule, mode=batch_size)
    if lr_find:
        tuner.lr_find(model, datamodule=datamodule)
