"""The task contract: what a LightningModule offers so that fasttrain's machinery can run it.

A task is the logic around a net for one kind of problem: its loss, its metrics, what its outputs
mean. Subclass `Task` and write the five pieces marked "a task writes" below; everything else
(optimizer and scheduler factories, lr scaling and re-planned schedules, input preprocessing on
the device, the sync-free training sums and the step convention of every logged value, the
best-value tracker, the checkpoint's record of what to rebuild) comes with it, the same for every
task. fasttrain.models.classifier and fasttrain.models.regressor are two complete examples.

What the machinery reads, and only this:

- `monitor`, `monitor_mode` (class attributes): the validation metric the run is judged by and
  its direction ("val/mse", "min"). The best checkpoint, early stopping, the `<monitor>_best`
  scalar and the k-fold summary follow it (conf/callbacks/best.yaml resolves `${monitor:}`).
- `charts`: this task's Custom Scalars charts in TensorBoard, beside the loss chart every task has.
- `forward(x)`: raw batch [B, *input_shape] (as the data module serves it) -> outputs in the
  task's own units (logits; targets in their original units): the input preprocessing, the net,
  then `output_layer()`, which an export appends to its file as well.
- `prediction_header` / `prediction_rows`: the columns of predictions.csv for a batch of outputs.
- `score`, `agreement`, `deviation`: the held-out score the export checks compare formats by
  (higher is better: accuracy, R^2), when two formats' outputs for a sample are the same answer,
  and their difference on the net's own scale.
- `data_mismatch(datamodule)`: why a data module cannot feed this model (evaluate, predict);
  `configure_data(datamodule)`: what the checkpoint recorded for it (a tokenizer);
  `example_inputs(batch, input_shape)`: inputs the net takes (random token ids, for a language
  model), for checks and tests.
- The checkpoint: `hparams` hold plain values and the Hydra specs of the net, optimizer and
  scheduler; `on_save_checkpoint` adds the task's and the data module's class, so
  fasttrain.checkpoints.load rebuilds any task with `from_hparams` after its allowlist checked
  every name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal

import torch
from torch import nn
from torchmetrics import MaxMetric, MeanMetric, Metric, MetricCollection, MinMetric

from fasttrain.config.domains import AtLeast, Range, check_arguments
from fasttrain.config.errors import ConfigError
from fasttrain.models.optim_plan import LrScaling, OptimizerFactory, OptimizerPlan, SchedulerFactory
from fasttrain.models.optim_plan import scale_lr as scale_lr  # classifier imports it from here
from fasttrain.models.protocols import takes_hidden_matrices
from fasttrain.models.spec import qualname, spec_of

Batch = tuple[torch.Tensor, torch.Tensor]

# Checkpoint keys of the data module's and the task's `_target_` (read back by
# fasttrain.checkpoints.load): evaluate, export and predict rebuild the task the checkpoint was
# trained as, and refuse to run it on another data module.
DATA_TARGET_KEY = "datamodule_target"
TASK_TARGET_KEY = "task_target"
# hparams that hold Hydra specs of objects (built from the spec when a checkpoint is loaded).
SPEC_KEYS = ("net", "optimizer", "scheduler")


class Task(OptimizerPlan):
    """The shared half of every task (see the module doc for the contract).

    Args:
        net: any nn.Module mapping a batch [B, ...] to the task's raw outputs [B, ...].
        optimizer: a factory taking the parameters (Hydra `_partial_: true`).
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
        input_mean, input_std: input preprocessing done here, on the device: the net takes
            (x - mean) / std of the batch as it arrives, converted to float (image data sets send
            uint8 pixels 0..255: a quarter of the host-to-device bytes of float32). One value, or
            one per channel of [B, C, H, W] inputs; in the checkpoint, so evaluate, export and
            predict apply it too. None: the batch goes to the net as it is (the data module
            preprocessed it on the host).
        **own: the subclass's own constructor arguments, recorded with the rest (plain values).
    """

    # ---- a task writes these -------------------------------------------------------------
    monitor: ClassVar[str] = "val/loss"
    monitor_mode: ClassVar[Literal["min", "max"]] = "min"
    # Custom Scalars charts (title -> regexes over the names logged: `^val/mse$`; TensorBoard
    # shows them in the task's group, fasttrain.callbacks.board) beside "loss: train vs val".
    charts: ClassVar[dict[str, list[str]]] = {}
    # Names of the per-epoch training means `train_sums` adds up (train/<name>), after the loss.
    train_sum_names: ClassVar[tuple[str, ...]] = ()

    def loss(self, outputs: torch.Tensor, y: torch.Tensor, training: bool) -> torch.Tensor:
        """The mean loss of a batch of raw net outputs (`training`: the training step's)."""
        raise NotImplementedError

    def make_metrics(self) -> dict[str, Metric | MetricCollection]:
        """Validation and test metrics beside the loss (name -> torchmetrics Metric), updated
        with (outputs in the task's units, y); built once per stage, when a Trainer first runs
        the task (configure_model), so it may read anything the constructor set."""
        return {}

    def train_sums(self, outputs: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        """Batch sums (0-d tensors, on the device) of `train_sum_names`; no host reads."""
        return []

    def output_layer(self) -> nn.Module | None:
        """Raw net outputs -> the task's units (None: they are already)."""
        return None

    def prediction_header(self, datamodule: Any) -> list[str]:
        raise NotImplementedError

    def prediction_rows(self, outputs: torch.Tensor, datamodule: Any) -> list[list[Any]]:
        """One predictions.csv row per sample of `outputs` (in the task's units), under
        `prediction_header`; fasttrain.deploy.predict adds the index and label columns. By
        default each output value, to 6 significant digits."""
        return [[f"{v:.6g}" for v in row] for row in outputs.reshape(len(outputs), -1).tolist()]

    def score(self) -> tuple[str, Metric]:
        """(name, metric) of the held-out score export compares formats by; higher is better."""
        raise NotImplementedError

    def agreement(self, outputs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """Per sample [B] bool: the two outputs give the same answer."""
        raise NotImplementedError

    def deviation(self, outputs: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
        """Elementwise difference that export's max|diff| tolerance is in: absolute where the
        reference is within [-1, 1] (logits), relative beyond (float32 keeps ~7 digits, so an
        output of 150 in its own units cannot match to 1e-4 absolute)."""
        from fasttrain.models.protocols import relative_deviation

        return relative_deviation(outputs, reference)

    def data_mismatch(self, datamodule: Any) -> str | None:
        """Why `datamodule` cannot feed this model (None: it can)."""
        return None

    def configure_data(self, datamodule: Any) -> None:
        """Hand a data module what this checkpoint recorded for it (a language model's
        tokenizer), before evaluate, export or predict set it up."""

    def export_module(self) -> tuple[nn.Module, dict[str, str]] | None:
        """(the module every exported file holds, what it takes in words), or None: then the
        net behind the data's input preprocessing and the output layer (fasttrain.deploy)."""
        return None

    def example_inputs(self, batch: int, input_shape: Sequence[int]) -> torch.Tensor:
        """A batch of inputs the net takes (token ids for a language model), for checks."""
        return torch.randn(batch, *input_shape)

    # ---- shared by every task -------------------------------------------------------------
    val_metrics: MetricCollection  # configure_model
    test_metrics: MetricCollection
    input_mean: torch.Tensor | None  # buffers (register_buffer below)
    input_std: torch.Tensor | None

    def __init__(
        self,
        net: nn.Module,
        optimizer: OptimizerFactory | None,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        lr_scaling: LrScaling = "none",
        base_batch_size: Annotated[int, AtLeast(1)] = 64,
        channels_last: bool = False,
        compile: bool = False,
        input_mean: Annotated[float | Sequence[float] | None, Range(what="numbers")] = None,
        input_std: Annotated[
            float | Sequence[float] | None, Range(0, low_open=True, what="values")
        ] = None,
        **own: Any,
    ) -> None:
        super().__init__()
        check_arguments(Task.__init__, locals())
        if channels_last:
            # 4-D weights only; others unchanged. torch's stubs lack Module.to(memory_format=).
            net = net.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        if takes_hidden_matrices(optimizer):  # Muon: checked before anything is written
            from fasttrain.models.muon import check_net_has_hidden_matrices

            check_net_has_hidden_matrices(optimizer, net)
        if compile:
            net.compile()  # in place: state_dict keys stay those of the plain net
        self.net = net
        self.channels_last = channels_last
        if (input_mean is None) != (input_std is None):
            raise ConfigError("input_std", input_std, "set input_mean and input_std together")
        # Not in the state_dict (the hyperparameters carry them): older checkpoints still load.
        self.register_buffer("input_mean", _per_channel(input_mean), persistent=False)
        self.register_buffer("input_std", _per_channel(input_std), persistent=False)
        self.lr, self.effective_batch_size = None, None  # fasttrain.models.optim_plan
        self.optimizer_factory, self.scheduler_factory = optimizer, scheduler
        self._planned_length, self._peak = {}, {}
        # Plain specs, never objects: checkpoints then load with torch.load(weights_only=True).
        self.save_hyperparameters({
            "net": spec_of(net), "optimizer": spec_of(optimizer), "scheduler": spec_of(scheduler),
            "scheduler_interval": scheduler_interval, "lr_scaling": lr_scaling,
            "base_batch_size": base_batch_size, "channels_last": channels_last,
            "compile": compile, "input_mean": _plain_floats(input_mean),
            "input_std": _plain_floats(input_std), **own,
        })  # fmt: skip
        # The held-out loss, a batch-weighted mean; the task's own metrics: configure_model.
        self.val_loss, self.test_loss = MeanMetric(), MeanMetric()
        self.monitor_best = MaxMetric() if self.monitor_mode == "max" else MinMetric()
        # Host values read on the last logging step, for the progress bar (never read per step).
        self.progress: dict[str, float] = {}
        self._train_sums = torch.zeros(1 + len(self.train_sum_names))  # [loss x samples, ...]
        self._train_samples, self._log_every, self._last_logged = [0], 1, -1

    def configure_model(self) -> None:
        """One collection of `make_metrics` per held-out stage ("<stage>/<name>"), built when a
        Trainer first runs the task: after the subclass's constructor (never called from Task's,
        so `make_metrics` may read whatever the subclass set) and before the model moves to its
        device. In float32 whatever the precision (bf16-true builds modules in bf16), as
        metrics built with the task were."""
        if hasattr(self, "val_metrics"):  # a second fit or test of the same model
            return
        dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32)
        try:
            self.val_metrics = MetricCollection(self.make_metrics(), prefix="val/")
            self.test_metrics = MetricCollection(self.make_metrics(), prefix="test/")
        finally:
            torch.set_default_dtype(dtype)

    @classmethod
    def from_hparams(cls, hparams: Mapping[str, Any]) -> Task:
        """The task a checkpoint's hyperparameters describe (their specs already allowed): each
        spec built, the arguments this class takes passed on (older checkpoints may lack some,
        or hold some it no longer takes)."""
        from hydra.utils import instantiate

        from fasttrain.config.schema import parameters_of

        taken, _ = parameters_of(cls)  # with Task's, which a subclass passes on in **base
        args = {k: v for k, v in hparams.items() if k in taken and k not in SPEC_KEYS}
        specs: dict[str, Any] = {
            k: instantiate(hparams[k]) if hparams.get(k) else None for k in SPEC_KEYS
        }
        model = cls(**specs, **args)
        # A net that records no arguments of its own (a plain nn.Module) keeps its stored spec,
        # so this model saves and loads again.
        model.hparams.update({k: hparams[k] for k in SPEC_KEYS if hparams.get(k)})
        return model

    def __setattr__(self, name: str, value: Any) -> None:
        # Lightning sets `_current_fx_name` (a plain str) before and after every hook call, ~44
        # times a training step; nn.Module.__setattr__ first checks the value against Parameter,
        # Module and buffer types (~2 us on torch 2.14, ~0.2 us this way).
        if name == "_current_fx_name":
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    def net_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """Raw batch -> the net's raw outputs, after the input preprocessing."""
        if self.input_mean is not None and self.input_std is not None:
            # uint8 -> float on the device; the default dtype is the run's (bf16 under
            # precision=bf16-true, where Lightning sets it around forward).
            x = (x.to(torch.get_default_dtype()) - self.input_mean) / self.input_std
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = self.net_outputs(x)
        layer = self.output_layer()
        return outputs if layer is None else layer(outputs)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[TASK_TARGET_KEY] = qualname(type(self))
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None:
            checkpoint[DATA_TARGET_KEY] = qualname(type(datamodule))

    def on_train_start(self) -> None:
        # The sanity-check validation ran on an untrained net; its value is not a "best".
        self.monitor_best.reset()
        # Set on the trainer at run time by Lightning's logger connector, hence unknown to mypy.
        self._log_every = max(1, self.trainer.log_every_n_steps)  # type: ignore[attr-defined]
        self._last_logged = -1
        # Lightning skips on_train_epoch_start when it resumes mid-epoch: the sums start here
        # too (that epoch's means then cover its resumed part).
        self._reset_train_sums()
        # The scaled lr is the first point of the `lr` scalar (fasttrain.callbacks.board), and
        # the effective batch size a column of the HPARAMS tab.
        self._replan_schedule()

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        x, y = batch
        outputs = self.net_outputs(x)
        loss = self.loss(outputs, y, True)
        # The epoch's sums stay on the device ([loss x samples, *train_sums]); no self.log here:
        # on a step that does not log, nothing is read back to the host (no sync) and
        # Lightning's per-call bookkeeping (~0.5 ms on a CPU) is not paid. In place (add_, a
        # list item): an attribute assignment on an nn.Module costs microseconds.
        extra = self.train_sums(outputs.detach(), y)
        self._train_sums.add_(torch.stack((loss.detach().float() * len(y), *extra)))
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
        size = 1 + len(self.train_sum_names)
        self._train_sums = torch.zeros(size, dtype=torch.float32, device=self.device)
        self._train_samples = [0]

    def on_train_epoch_end(self) -> None:
        # One sync per epoch: the sums of every process (DDP), then the epoch's means. One
        # process (DataParallel included, whose reduce would average the values) has them.
        totals = torch.cat((self._train_sums, self._train_sums.new_tensor(self._train_samples)))
        if self.trainer.world_size > 1:
            totals = self.trainer.strategy.reduce(totals, reduce_op="sum")
        means = totals[:-1] / totals[-1].clamp(min=1)
        # Already reduced: equal on every rank (sync_dist only keeps Lightning from warning).
        self.log("train/loss_epoch", means[0], sync_dist=True)
        for name, value in zip(self.train_sum_names, means[1:], strict=True):
            self.log(f"train/{name}", value, sync_dist=True)
        self._log_at_steps_completed()
        # For callbacks that monitor train/loss (EarlyStopping, ModelCheckpoint), not logged twice.
        self.log("train/loss", means[0], logger=False, sync_dist=True)
        self.progress["train/loss"] = float(means[0])

    def _held_out_step(self, batch: Batch, stage: Literal["val", "test"]) -> None:
        x, y = batch
        outputs = self.net_outputs(x)
        loss = self.loss(outputs, y, False)
        layer = self.output_layer()
        shown = (outputs if layer is None else layer(outputs)).detach()
        mean_loss = self.val_loss if stage == "val" else self.test_loss
        metrics = self.val_metrics if stage == "val" else self.test_metrics
        mean_loss.update(loss.detach(), weight=len(y))
        metrics.update(shown, y)
        shown_in_bar = stage == "val"
        self.log(f"{stage}/loss", mean_loss, on_epoch=True, prog_bar=shown_in_bar)
        self.log_dict(metrics, on_epoch=True, prog_bar=shown_in_bar)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self._held_out_step(batch, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self._held_out_step(batch, "test")

    def on_validation_epoch_end(self) -> None:
        watched = {"val/loss": self.val_loss, **dict(self.val_metrics.items(keep_base=False))}
        if self.monitor in watched:  # `<monitor>_best`: the best value so far (e.g. val/mse_best)
            self.monitor_best(watched[self.monitor].compute())
            self.log(f"{self.monitor}_best", self.monitor_best.compute(), sync_dist=True)
        self._log_at_steps_completed()

    def _log_at_steps_completed(self) -> None:
        # Lightning writes epoch-end and validation values at x = its count of stepped batches
        # before the current one is added (4 after 5 optimizer steps); a logged "step" is the x
        # it uses instead: the optimizer steps completed, as every other scalar.
        self.log("step", float(self.trainer.global_step), sync_dist=True)  # equal on every rank


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
