"""Classification task logic around any nn.Module: loss, metrics, optimizer and schedule."""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import nn
from torchmetrics import MaxMetric
from torchmetrics.classification import MulticlassAccuracy

from fasttrain.config.errors import ConfigError, UserError
from fasttrain.config.settings import RUN_LENGTH_ARGS
from fasttrain.models.spec import qualname, spec_of

OptimizerFactory = Callable[[Iterable[torch.nn.Parameter]], torch.optim.Optimizer]
SchedulerFactory = Callable[[torch.optim.Optimizer], Any]
LrScaling = Literal["none", "linear", "sqrt"]

# Checkpoint key of the data module's `_target_` (read back by fasttrain.checkpoints.load):
# evaluate, export and predict then refuse to run the checkpoint on another data module.
DATA_TARGET_KEY = "datamodule_target"


def scale_lr(lr: float, effective_batch: int, base_batch: int, rule: LrScaling) -> float:
    """The learning rate for `effective_batch` given one tuned at `base_batch`.

    "linear": lr x k for k times the batch (Goyal et al., SGD); "sqrt": lr x sqrt(k), which suits
    adaptive optimizers (Adam) better; "none": unchanged.
    """
    ratio = effective_batch / base_batch
    return {"none": lr, "linear": lr * ratio, "sqrt": lr * math.sqrt(ratio)}[rule]


class Classifier(L.LightningModule):
    """Cross-entropy classification; logs train/loss, val/loss, val/acc, val/acc_best, test/acc.

    Args:
        net: any nn.Module mapping a batch [B, ...] to logits [B, num_classes].
        optimizer: a factory taking the parameters (Hydra `_partial_: true`).
        num_classes: number of classes, for the accuracy metrics.
        scheduler: a factory taking the optimizer, or None for a constant learning rate. A
            length argument it leaves out (T_max, total_steps) is set to the run's length in
            scheduler steps: trainer.max_epochs, or the run's optimizer steps (interval "step").
            A resumed run of another length keeps its position on a schedule re-planned for
            the new length. A peak `max_lr` it leaves out (OneCycleLR) is the optimizer's lr,
            after `lr_scaling` or the LR finder.
        scheduler_interval: step the scheduler every "epoch" or every optimizer "step".
        lr_scaling: scale the optimizer's lr by the effective batch size (batch_size x
            accumulate_grad_batches x world size) over `base_batch_size`: none, linear or sqrt.
        base_batch_size: the effective batch size the optimizer's lr was tuned for.
        channels_last: NHWC memory format for the net and 4-D inputs (faster convs on Tensor Cores).
        compile: torch.compile the net (not this module: compiling it would break `self.log`).
        label_smoothing: the training loss's target smoothing (F.cross_entropy), in [0, 1).
            Validation and test losses stay plain cross-entropy, comparable between runs.
        input_mean, input_std: input preprocessing done here, on the device: the net takes
            (x - mean) / std of the batch as it arrives, converted to float (image data sets send
            uint8 pixels 0..255: a quarter of the host-to-device bytes of float32). One value, or
            one per channel of [B, C, H, W] inputs; in the checkpoint, so evaluate, export and
            predict apply it too. None: the batch goes to the net as it is (the data module
            preprocessed it on the host).
    """

    input_mean: torch.Tensor | None  # buffers (register_buffer below)
    input_std: torch.Tensor | None

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory | None,
        num_classes: int,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        lr_scaling: LrScaling = "none",
        base_batch_size: int = 64,
        channels_last: bool = False,
        compile: bool = False,
        input_mean: float | Sequence[float] | None = None,
        input_std: float | Sequence[float] | None = None,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ConfigError("num_classes", num_classes, "expected an int >= 2")
        if scheduler_interval not in ("epoch", "step"):
            raise ConfigError("scheduler_interval", scheduler_interval, "expected epoch or step")
        if lr_scaling not in ("none", "linear", "sqrt"):
            raise ConfigError("lr_scaling", lr_scaling, "expected one of 'none', 'linear', 'sqrt'")
        if base_batch_size < 1:
            raise ConfigError("base_batch_size", base_batch_size, "expected an int >= 1")
        if not 0.0 <= label_smoothing < 1.0:
            raise ConfigError("label_smoothing", label_smoothing, "expected a number in [0, 1)")
        self.label_smoothing = float(label_smoothing)
        if channels_last:
            # 4-D weights only; others unchanged. torch's stubs lack Module.to(memory_format=).
            net = net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        if compile:
            net.compile()  # in place: state_dict keys stay those of the plain net
        self.net = net
        self.channels_last = channels_last
        if (input_mean is None) != (input_std is None):
            raise ConfigError("input_std", input_std, "set input_mean and input_std together")
        if input_std is not None and min(_as_list(input_std)) <= 0:
            raise ConfigError("input_std", input_std, "expected values > 0")
        # Not in the state_dict (the hyperparameters carry them): older checkpoints still load.
        self.register_buffer("input_mean", _per_channel(input_mean), persistent=False)
        self.register_buffer("input_std", _per_channel(input_std), persistent=False)
        # Set by the LR finder (tuner.lr_find=true); overrides the optimizer's lr when not None.
        self.lr: float | None = None
        self.effective_batch_size: int | None = None
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self._planned_length: dict[str, Any] = {}  # the schedule's length args for this run
        self._peak: dict[str, Any] = {}  # max_lr when the scheduler config leaves it out
        # Plain specs, never objects: checkpoints then load with torch.load(weights_only=True).
        self.save_hyperparameters({
            "net": spec_of(net), "optimizer": spec_of(optimizer), "scheduler": spec_of(scheduler),
            "num_classes": num_classes, "scheduler_interval": scheduler_interval,
            "lr_scaling": lr_scaling, "base_batch_size": base_batch_size,
            "channels_last": channels_last, "compile": compile,
            "input_mean": _plain_floats(input_mean), "input_std": _plain_floats(input_std),
            "label_smoothing": float(label_smoothing),
        })  # fmt: skip
        # micro average = plain accuracy (fraction of correct predictions).
        self.val_acc = MulticlassAccuracy(num_classes, average="micro")
        self.test_acc = MulticlassAccuracy(num_classes, average="micro")
        self.val_acc_best = MaxMetric()
        # Host values read on the last logging step, for the progress bar (never read per step).
        self.progress: dict[str, float] = {}
        self._train_sums = torch.zeros(2)  # [loss x samples, correct] of the epoch, on the device
        self._train_samples, self._log_every, self._last_logged = [0], 1, -1

    def __setattr__(self, name: str, value: Any) -> None:
        # Lightning sets `_current_fx_name` (a plain str) before and after every hook call, ~44
        # times a training step; nn.Module.__setattr__ first checks the value against Parameter,
        # Module and buffer types (~2 us on torch 2.14, ~0.2 us this way).
        if name == "_current_fx_name":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_mean is not None and self.input_std is not None:
            # uint8 -> float on the device; the default dtype is the run's (bf16 under
            # precision=bf16-true, where Lightning sets it around forward).
            x = (x.to(torch.get_default_dtype()) - self.input_mean) / self.input_std
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)

    def _shared_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], smoothing: float = 0.0
    ) -> tuple[torch.Tensor, ...]:
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits, y, label_smoothing=smoothing), logits.detach(), y

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None:
            checkpoint[DATA_TARGET_KEY] = qualname(type(datamodule))

    def on_train_start(self) -> None:
        # The sanity-check validation ran on an untrained net; its accuracy is not a "best".
        self.val_acc_best.reset()
        # Set on the trainer at run time by Lightning's logger connector, hence unknown to mypy.
        self._log_every = max(1, self.trainer.log_every_n_steps)  # type: ignore[attr-defined]
        self._last_logged = -1
        # Lightning skips on_train_epoch_start when it resumes mid-epoch: the sums start here
        # too (that epoch's means then cover its resumed part).
        self._reset_train_sums()
        # The scaled lr is the first point of the `lr` scalar (fasttrain.callbacks.board), and
        # the effective batch size a column of the HPARAMS tab.
        self._replan_schedule()

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        loss, logits, y = self._shared_step(batch, self.label_smoothing)
        # The epoch's sums stay on the device ([loss x samples, correct]); no self.log here: on
        # a step that does not log, nothing is read back to the host (no sync) and Lightning's
        # per-call bookkeeping (~0.5 ms on a CPU) is not paid.
        # In place (add_, a list item): an attribute assignment on an nn.Module costs microseconds.
        correct = (logits.argmax(dim=-1) == y).sum(dtype=torch.float32)
        self._train_sums.add_(torch.stack((loss.detach().float() * len(y), correct)))
        self._train_samples[0] += len(y)
        step = self.trainer.global_step
        if step % self._log_every == 0 and step != self._last_logged:
            self._log_step(loss, step)
        return loss

    def _log_step(self, loss: torch.Tensor, step: int) -> None:
        """Write this step's values at x = optimizer steps completed (the first micro-batch of an
        accumulation window): the one read of the loss every `trainer.log_every_n_steps`."""
        self._last_logged = step
        value = loss.item()
        for logger in self.loggers:
            logger.log_metrics({"train/loss_step": value}, step=step)
        self.progress["train/loss"] = value  # shown by fasttrain.callbacks.progress.ProgressBar

    def on_train_epoch_start(self) -> None:
        self._reset_train_sums()

    def _reset_train_sums(self) -> None:
        self._train_sums = torch.zeros(2, dtype=torch.float32, device=self.device)
        self._train_samples = [0]

    def on_train_epoch_end(self) -> None:
        # One sync per epoch: the sums of every process (DDP), then the epoch's means. One
        # process (DataParallel included, whose reduce would average the three values) has them.
        totals = torch.cat((self._train_sums, self._train_sums.new_tensor(self._train_samples)))
        if self.trainer.world_size > 1:
            totals = self.trainer.strategy.reduce(totals, reduce_op="sum")
        loss, acc = totals[0] / totals[2].clamp(min=1), totals[1] / totals[2].clamp(min=1)
        # Already reduced: equal on every rank (sync_dist only keeps Lightning from warning).
        self.log("train/loss_epoch", loss, sync_dist=True)
        self.log("train/acc", acc, sync_dist=True)
        self._log_at_steps_completed()
        # For callbacks that monitor train/loss (EarlyStopping, ModelCheckpoint), not logged twice.
        self.log("train/loss", loss, logger=False, sync_dist=True)
        self.progress["train/loss"] = float(loss)

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, logits, y = self._shared_step(batch)
        self.val_acc.update(logits, y)
        self.log("val/loss", loss, on_epoch=True, prog_bar=True, sync_dist=True)
        self.log("val/acc", self.val_acc, on_epoch=True, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True)
        self._log_at_steps_completed()

    def _log_at_steps_completed(self) -> None:
        # Lightning writes epoch-end and validation values at x = its count of stepped batches
        # before the current one is added (4 after 5 optimizer steps); a logged "step" is the x
        # it uses instead: the optimizer steps completed, as every other scalar.
        self.log("step", float(self.trainer.global_step), sync_dist=True)  # equal on every rank

    def test_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        loss, logits, y = self._shared_step(batch)
        self.test_acc.update(logits, y)
        self.log("test/loss", loss, on_epoch=True, sync_dist=True)
        self.log("test/acc", self.test_acc, on_epoch=True)

    def configure_optimizers(self) -> Any:
        if self.optimizer_factory is None:
            raise ConfigError("optimizer", None, "training needs an optimizer factory")
        optimizer = self._clippable(self.optimizer_factory)(self.parameters())
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
        for group in optimizer.param_groups:
            if self.lr is not None:  # found for this very batch size: no further scaling
                group["lr"] = self.lr
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
        steps = trainer.estimated_stepping_batches
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


def _per_channel(values: float | Sequence[float] | None) -> torch.Tensor | None:
    """None, a scalar tensor, or [C, 1, 1] for per-channel values (broadcast over [B, C, H, W])."""
    if values is None:
        return None
    flat = torch.tensor(_as_list(values), dtype=torch.float32)
    return flat.reshape(()) if flat.numel() == 1 else flat.view(-1, 1, 1)


def _plain_floats(values: float | Sequence[float] | None) -> float | list[float] | None:
    """A plain float or list of floats (checkpoint hyperparameters hold no OmegaConf lists)."""
    if values is None or isinstance(values, (int, float)):
        return None if values is None else float(values)
    return [float(v) for v in values]


def _as_list(values: float | Sequence[float]) -> list[float]:
    plain = _plain_floats(values)
    if isinstance(plain, list) and not plain:
        raise ConfigError("input_mean", values, "expected a number or a non-empty list")
    return plain if isinstance(plain, list) else [float(plain or 0.0)]


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
