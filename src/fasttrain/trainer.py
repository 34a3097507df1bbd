"""lightning.Trainer whose arguments are checked at build time, so a bad override fails with one
line naming it (`trainer.gradient_clip_val=-1: expected a number >= 0 or null`) before any
training, instead of deep inside fit.

Lightning annotates `gradient_clip_algorithm` as a plain str, checks `strategy` only when it
builds the accelerator connector (with an incomplete list of names) and never checks the sign of
`gradient_clip_val`; this subclass gives those arguments a typed signature and range checks.
Every other argument passes through to lightning.Trainer unchanged (and fasttrain.schema checks
them against Lightning's own signature).
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
from lightning.pytorch.strategies import Strategy, StrategyRegistry

import fasttrain.strategies  # noqa: F401  (registers `dp` before any Trainer is built)
from fasttrain.errors import ConfigError

ClipAlgorithm = Literal["norm", "value"]


def strategy_names() -> list[str]:
    return ["auto", *StrategyRegistry.available_strategies()]


class Trainer(L.Trainer):
    """lightning.Trainer with checked strategy, accumulation and clipping arguments."""

    def __init__(
        self,
        *,
        strategy: str | Strategy = "auto",
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: ClipAlgorithm | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(strategy, str) and strategy.lower() not in strategy_names():
            raise ConfigError(
                "strategy", strategy, f"expected one of {', '.join(strategy_names())}"
            )
        if accumulate_grad_batches < 1:
            raise ConfigError(
                "accumulate_grad_batches", accumulate_grad_batches, "expected an int >= 1"
            )
        if gradient_clip_val is not None and gradient_clip_val < 0:
            raise ConfigError(
                "gradient_clip_val", gradient_clip_val, "expected a number >= 0 or null"
            )
        if gradient_clip_algorithm not in (None, "norm", "value"):
            raise ConfigError(
                "gradient_clip_algorithm",
                gradient_clip_algorithm,
                "expected one of 'norm', 'value'",
            )
        super().__init__(
            strategy=strategy,
            accumulate_grad_batches=accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm,
            **kwargs,
        )
