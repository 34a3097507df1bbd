"""The optimizer half of the task contract (fasttrain.models.task.Task inherits it): the optimizer
and scheduler built from their factories, the lr scaled by the effective batch size, the
schedule's length set to the run's and re-planned when a resumed run is made longer."""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from collections.abc import Callable, Iterable
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import nn

from fasttrain.config.errors import ConfigError, UserError
from fasttrain.config.settings import RUN_LENGTH_ARGS
from fasttrain.models.protocols import takes_hidden_matrices

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]
LrScaling = Literal["none", "linear", "sqrt"]


def scale_lr(lr: float, effective_batch: int, base_batch: int, rule: LrScaling) -> float:
    """The learning rate for `effective_batch` given one tuned at `base_batch`.

    "linear": lr x k for k times the batch (Goyal et al., SGD); "sqrt": lr x sqrt(k), which suits
    adaptive optimizers (Adam) better; "none": unchanged.
    """
    ratio = effective_batch / base_batch
    return {"none": lr, "linear": lr * ratio, "sqrt": lr * math.sqrt(ratio)}[rule]


class OptimizerPlan(L.LightningModule):
    """configure_optimizers and what it plans; Task's constructor sets these attributes."""

    net: nn.Module
    optimizer_factory: OptimizerFactory | None
    scheduler_factory: SchedulerFactory | None
    lr: float | None  # set by the LR finder (tuner.lr_find=true); overrides the optimizer's lr
    effective_batch_size: int | None
    _planned_length: dict[str, Any]  # the schedule's length args for this run
    _peak: dict[str, Any]  # max_lr when the scheduler config leaves it out

    def configure_optimizers(self) -> Any:
        if self.optimizer_factory is None:
            raise ConfigError("optimizer", None, "training needs an optimizer factory")
        factory = self._clippable(self.optimizer_factory)
        groups = self.param_groups()
        if takes_hidden_matrices(factory):  # Muon's groups apart (fasttrain.models.muon)
            from fasttrain.models.muon import mark_hidden_matrices

            groups = mark_hidden_matrices(groups, self.net)
        optimizer = factory(groups)
        self._scale_lr(optimizer)
        if self.scheduler_factory is None:
            return optimizer
        self._peak = self._peak_args(optimizer)
        length = self._length_args()
        _check_warmup(self.scheduler_factory, length)
        scheduler = self.scheduler_factory(optimizer, **self._peak, **length)
        self._planned_length = _length_of(scheduler)
        interval = self.hparams["scheduler_interval"]
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": interval},
        }

    def param_groups(self) -> Any:
        """What the optimizer factory takes: every parameter (a task may group them, e.g. weight
        decay on matrices only)."""
        return self.parameters()

    def _clippable(self, factory: OptimizerFactory) -> OptimizerFactory:
        """The factory, unfused where Lightning could not clip: it refuses gradient clipping under
        mixed precision with an optimizer that unscales gradients itself (fused: the default of
        the shipped optimizers, for speed and a sync-free GradScaler)."""
        trainer = self.trainer
        mixed = str(trainer.precision).endswith("-mixed")
        keywords = getattr(factory, "keywords", {})
        if not (mixed and trainer.gradient_clip_val and keywords.get("fused")):
            return factory
        rank_zero_info(
            f"model.optimizer.fused=false for this run: Lightning clips gradients "
            f"(trainer.gradient_clip_val={trainer.gradient_clip_val}) under "
            f"trainer.precision={trainer.precision} only with an unfused optimizer"
        )
        assert isinstance(factory, functools.partial)
        return functools.partial(factory.func, *factory.args, **{**keywords, "fused": False})

    def _scale_lr(self, optimizer: torch.optim.Optimizer) -> None:
        """Apply the LR finder's lr, or scale the configured lr by the effective batch size."""
        rule = self.hparams["lr_scaling"]
        datamodule = getattr(self.trainer, "datamodule", None)
        batch_size = getattr(datamodule, "batch_size", None)
        if batch_size is not None:
            world = self.trainer.world_size
            self.effective_batch_size = batch_size * self.trainer.accumulate_grad_batches * world
        configured = optimizer.defaults.get("lr")
        for group in optimizer.param_groups:
            if self.lr is not None:  # found for this very batch size: no further scaling
                # Groups of another lr than the configured one (Muon's AdamW groups) keep
                # their ratio to it.
                own = group["lr"] == configured or not configured
                group["lr"] = self.lr if own else self.lr * group["lr"] / configured
            elif rule != "none" and self.effective_batch_size is not None:
                base = self.hparams["base_batch_size"]
                group["lr"] = scale_lr(group["lr"], self.effective_batch_size, base, rule)
        if rule != "none" or self.lr is not None:
            rank_zero_info(
                f"lr {optimizer.param_groups[0]['lr']:.3g} for effective batch "
                f"{self.effective_batch_size} (lr_scaling={rule}, "
                f"base_batch_size={self.hparams['base_batch_size']})"
            )

    def _length_args(self) -> dict[str, int]:
        """The length arguments the scheduler factory leaves out, set to the run's length."""
        factory = self.scheduler_factory
        if not isinstance(factory, functools.partial):
            return {}
        params = inspect.signature(factory.func).parameters
        left_out = [a for a in RUN_LENGTH_ARGS if a in params and a not in factory.keywords]
        return dict.fromkeys(left_out, self._run_length()) if left_out else {}

    def _peak_args(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """max_lr, when the factory takes it and leaves it out: each group's (scaled) lr."""
        factory = self.scheduler_factory
        if not isinstance(factory, functools.partial) or "max_lr" in factory.keywords:
            return {}
        if "max_lr" not in inspect.signature(factory.func).parameters:
            return {}
        return {"max_lr": [group["lr"] for group in optimizer.param_groups]}

    def _run_length(self) -> int:
        """The run's length in scheduler steps: its epochs, or its optimizer steps."""
        trainer = self.trainer
        if self.hparams["scheduler_interval"] == "epoch":
            if trainer.max_epochs is None or trainer.max_epochs < 0:
                raise UserError(
                    f"model.scheduler_interval=epoch: the lr schedule runs over epochs but "
                    f"trainer.max_epochs={trainer.max_epochs} sets no number of epochs; set "
                    "trainer.max_epochs, or model.scheduler_interval=step to schedule over "
                    "the run's optimizer steps (e.g. trainer.max_steps)"
                )
            return max(1, trainer.max_epochs)
        loaded = trainer.train_dataloader is not None
        steps = trainer.estimated_stepping_batches
        if not loaded and trainer.ckpt_path is not None:
            _set_up_data_after_restore(trainer)
        if math.isinf(steps):
            raise UserError(
                "model.scheduler_interval=step: the lr schedule needs the run's length, but "
                "trainer.max_epochs=-1 and no trainer.max_steps bound the run; set one of them"
            )
        return max(1, int(steps))

    def _replan_schedule(self) -> None:
        """A resumed run gets its scheduler's state back, length included: a run extended from
        1 to 3 epochs would go on with a 1-epoch cosine (lr 0, then up again). Keep the position
        (steps taken) and rebuild the schedule for this run's length by replaying those steps
        (public scheduler API only: the constructor, then step())."""
        configs = self.trainer.lr_scheduler_configs
        if not configs or not self._planned_length or self.scheduler_factory is None:
            return
        scheduler = configs[0].scheduler
        restored = _length_of(scheduler)
        # Same keys, other values: this scheduler with another length (the LR finder swaps in
        # a scheduler of its own, which is left alone).
        if restored.keys() != self._planned_length.keys() or restored == self._planned_length:
            return
        position = int(scheduler.last_epoch)
        optimizer = scheduler.optimizer
        for group in optimizer.param_groups:  # the constructor starts from the current lr
            group["lr"] = group["initial_lr"]
        fresh = self.scheduler_factory(optimizer, **self._peak, **self._planned_length)
        with warnings.catch_warnings():
            # torch warns about scheduler steps before any optimizer step: this is a replay.
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(position):
                fresh.step()
        scheduler.load_state_dict(fresh.state_dict())
        unit = self.hparams["scheduler_interval"]
        rank_zero_info(
            f"lr schedule re-planned for this run's length: {type(scheduler).__name__} "
            f"{_shown(restored)} -> {_shown(self._planned_length)} {unit}s, continuing at "
            f"{unit} {position} with lr {optimizer.param_groups[0]['lr']:.3g}"
        )


def _set_up_data_after_restore(trainer: Any) -> None:
    """estimated_stepping_batches sets the training loader up before Lightning restores the
    checkpoint's loops, and the fit loop sets its data up once: the loader's mid-epoch position
    would never be applied, and a resumed run would replay its epoch from the first batch. Drop
    that loader so the fit loop sets it up again after the restore. Private: Lightning has no
    public way to estimate the steps without setting the data up; the bit-exact resume test of
    a step-scheduled run (tests/test_gpt_modern.py) fails if this internal changes."""
    fit_loop = trainer.fit_loop
    if fit_loop._data_fetcher is not None:
        fit_loop._data_fetcher.teardown()  # its loader's workers, if any, stop here
        fit_loop._data_fetcher = None
    fit_loop._combined_loader = None


def _check_warmup(factory: SchedulerFactory, length: dict[str, int]) -> None:
    """torch's OneCycleLR divides by zero when its warm-up phase is exactly one step
    (pct_start x total_steps == 1, e.g. 4 steps at pct_start=0.25): refuse that in one line."""
    keywords = getattr(factory, "keywords", {})
    total = length.get("total_steps", keywords.get("total_steps"))
    if getattr(factory, "func", None) is not torch.optim.lr_scheduler.OneCycleLR or not total:
        return
    pct = keywords.get("pct_start", 0.3)
    if float(pct * total) - 1 == 0:  # torch's own arithmetic: its warm-up phase ends at step 0
        raise UserError(
            f"model.scheduler.pct_start={pct}: the one-cycle warm-up would be exactly 1 of the "
            f"run's {total} optimizer steps, which torch's OneCycleLR divides by zero on; "
            "another run length (trainer.max_steps, trainer.max_epochs) or "
            "model.scheduler.pct_start"
        )


def _length_of(scheduler: Any) -> dict[str, Any]:
    state = scheduler.state_dict()
    return {arg: state[arg] for arg in RUN_LENGTH_ARGS if arg in state}


def _shown(length: dict[str, Any]) -> str:
    return ", ".join(f"{arg}={value}" for arg, value in length.items())
