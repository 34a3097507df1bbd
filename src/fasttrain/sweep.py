"""What a run hands back to a Hydra sweeper (Optuna, or any other): the one metric it optimises.

The task function's return value is what a sweeper reads, so a misspelt metric name must fail
loudly: Optuna would otherwise compare `None`s and report a meaningless "best" trial.
"""

from __future__ import annotations

from collections.abc import Mapping

from fasttrain.errors import UserError


def optimized_metric(metrics: Mapping[str, float], name: str | None) -> float | None:
    """The value of `name` among the run's final metrics; None when no metric is optimised."""
    if name is None:
        return None
    if name not in metrics:
        logged = ", ".join(sorted(metrics)) or "none"
        raise UserError(f"optimized_metric={name!r}: the run never logged it; logged: {logged}")
    return float(metrics[name])
