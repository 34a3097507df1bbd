"""The metrics a run's callbacks watch (ModelCheckpoint, EarlyStopping: `monitor`, `mode`),
checked against the task: a `mode` against the metric's direction, before anything runs
(`callbacks.best.monitor=val/loss` alone kept the classifier's mode=max, and so the weights of
the highest validation loss as the best), and a monitor the run never logs, said as the
override to fix when Lightning finds it missing inside fit (a traceback, the folder written);
likewise a sweep's `optimized_metric` of the validation (`OptimizedMetric`), at the first
validation rather than once the whole run has trained.
"""

from __future__ import annotations

import contextlib
from typing import Any
from weakref import WeakKeyDictionary

import lightning as L
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig

from fasttrain.config.errors import UserError

# Metric names whose lower value is the better one, whichever task logs them.
LOWER_IS_BETTER = {"loss", "loss_epoch", "loss_step", "mse", "mae", "rmse", "ppl", "bpb"}
# callback -> its config key (callbacks.best), for the error that names its override.
config_keys: WeakKeyDictionary[Any, str] = WeakKeyDictionary()


def direction(model: Any, name: str) -> str | None:
    """ "min" or "max": the better way for the metric logged as `name` (val/acc, val/acc_best),
    from its name, the task's `monitor_mode` or the task's torchmetrics' `higher_is_better`;
    None where the task does not say."""
    short = name.rsplit("/", 1)[-1].removesuffix("_best")
    if short in LOWER_IS_BETTER:
        return "min"
    mode = getattr(model, "monitor_mode", None)
    if name.removesuffix("_best") == getattr(model, "monitor", None) and mode in ("min", "max"):
        return str(mode)
    metrics: dict[str, Any] = {}
    with contextlib.suppress(Exception):  # a task's metrics may need its data: no answer then
        metrics = dict(model.make_metrics())
    better = getattr(metrics.get(short), "higher_is_better", None)
    return None if better is None else ("max" if better else "min")


def check_modes(callbacks: DictConfig | None, model: Any) -> None:
    """Refuse a callback whose `mode` keeps the worst value of the metric it monitors."""
    for name, node in (callbacks or {}).items():
        if not isinstance(node, DictConfig) or not node.get("monitor"):
            continue
        monitor, mode = str(node.monitor), str(node.get("mode", "min"))  # Lightning's default
        better, key = direction(model, monitor), f"callbacks.{name!s}"
        if better and better != mode:
            way = "higher" if better == "max" else "lower"
            raise UserError(
                f"{key}.mode={mode}: {monitor} is better {way}, so the "
                f"{'lowest' if mode == 'min' else 'highest'} would be kept as the best; "
                f"set {key}.mode={better}"
            )


def never_logged(trainer: Any, error: Exception) -> UserError | None:
    """`error` as the callback's monitor the run does not log (ModelCheckpoint's and
    EarlyStopping's own errors, raised once validation ran without it, name it), said as its
    override and the names the run does log; None for any other error."""
    if not isinstance(error, (MisconfigurationException, RuntimeError)):
        return None
    logged = set(trainer.callback_metrics)
    for callback in trainer.callbacks:
        monitor = getattr(callback, "monitor", None)
        if isinstance(monitor, str) and monitor not in logged and monitor in str(error):
            key = config_keys.get(callback, "callbacks.<name>")
            return UserError(
                f"{key}.monitor={monitor}: the run logs no {monitor}; it logs "
                f"{', '.join(sorted(logged))}"
            )
    return None


class OptimizedMetric(L.Callback):
    """Refuses `optimized_metric=val/...` when the first validation did not log it: a misspelt
    name was found only when the run ended (each job of a sweep trained in full, then failed).
    Names of other splits (test/...) are known at the end only; fasttrain.cli checks them there.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.checked = False

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.checked or trainer.sanity_checking:
            return
        self.checked = True
        logged = sorted(n for n in trainer.callback_metrics if n.startswith("val/"))
        if self.name not in trainer.callback_metrics:
            raise UserError(
                f"optimized_metric={self.name!r}: the run never logs it; its validation logs "
                f"{', '.join(logged) or 'nothing'}"
            )
