"""Config -> objects: `build_run(cfg)` gives the (trainer, model, datamodule) of a training run
(the (model, datamodule) of a checkpoint: fasttrain.assemble.restore); the tasks and the tests
use both. Components never see the config.

Every failure of a constructor on bad input becomes one UserError that names the override,
e.g. `data.batch_size=0: expected an int >= 1`.

`Trainer` is lightning.Trainer with checked strategy, accumulation and clipping arguments:
Lightning annotates `gradient_clip_algorithm` as a plain str, checks `strategy` only when it
builds the accelerator connector (with an incomplete list of names) and never checks the sign of
`gradient_clip_val`. Its ModelCheckpoints restore only the files of their own folder
(`confine_restored_paths`). It also trims Lightning's per-step cost of calling hooks that do
nothing (`NoProfiler`, `skip_unused_step_hooks`). Every other argument passes through unchanged (and
fasttrain.config.schema checks them against Lightning's own signature).
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import lightning as L
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.profilers import PassThroughProfiler
from lightning.pytorch.strategies import Strategy, StrategyRegistry
from omegaconf import DictConfig, OmegaConf

from fasttrain.assemble.monitors import OptimizedMetric, check_modes, config_keys, never_logged
from fasttrain.checkpoints.io import AtomicCheckpointIO, ModelSpec
from fasttrain.checkpoints.state import ResumeState, confine_restored_paths
from fasttrain.config.domains import AtLeast, NonNegative, check_arguments
from fasttrain.config.errors import ConfigError, UserError
from fasttrain.config.schema import validate
from fasttrain.models.spec import plain


class _NoAdverts(logging.Filter):
    """Drops Lightning's "Tip: ... try installing litlogger" line, printed on every run, and its
    litmodels one, printed when Lightning adds its own checkpoint callback (callbacks=none)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return "litlogger" not in message and "litmodels" not in message


# Lightning logs through these (rank_zero_info); a filter is logging's public way to drop one line.
for _name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
    logging.getLogger(_name).addFilter(_NoAdverts())


def build(node: DictConfig, path: str, **kwargs: Any) -> Any:
    """Instantiate one `_target_` node; arguments reach the class as plain lists and dicts."""
    try:
        return instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        # Hydra's exception has no field for the failing node, only `full_key: ...` in its text
        # (relative to `node`, or from the root for a node taken out of a bigger config);
        # tests/test_bad_input.py fails if that text changes.
        key = re.search(r"full_key: (\S+)", str(err))
        full = key.group(1) if key else path
        where = full if full == path or full.startswith(f"{path}.") else f"{path}.{full}"
        if isinstance(cause, ConfigError):
            raise cause.at(where) from None
        if isinstance(cause, (UserError, ValueError, MisconfigurationException)):
            said = str(cause)
            # A message that names its override already (data.path: ...) gets no second prefix.
            named = said.startswith((f"{where}.", f"{where}=", f"{path}.", f"{path}="))
            raise UserError(said if named else f"{where}: {said}") from None
        raise


def build_all(group: DictConfig | None, path: str) -> list[Any]:
    """Build each named entry of a group like `callbacks:` or `logger:`; null entries skip."""
    if not group:
        return []
    built = []
    for name, node in group.items():
        if isinstance(node, DictConfig) and "_target_" in node:
            built.append(obj := build(node, f"{path}.{name!s}"))
            with contextlib.suppress(TypeError):  # an object weakref cannot hold: no key
                config_keys[obj] = f"{path}.{name!s}"
    return built


def build_model(node: DictConfig, **kwargs: Any) -> Any:
    """The LightningModule of `model:`. A net that does not record its own arguments (any plain
    nn.Module) gets the spec of its config node, so checkpoints can always rebuild it."""
    model = build(node, "model", **kwargs)
    hparams = getattr(model, "hparams", {})
    if "net" in hparams and hparams["net"] is None and "net" in node:
        hparams["net"] = plain(OmegaConf.to_container(node.net, resolve=True))
    return model


def build_run(
    cfg: DictConfig,
    callbacks: Sequence[Any] = (),
    *,
    validated: bool = False,
    **model_kwargs: Any,
) -> tuple[Any, Any, Any]:
    """(trainer, model, datamodule) of a training run, as `python train.py` builds them; extra
    `callbacks` and `model_kwargs` are for tests that inspect one practice. `validated`: `cfg`
    passed fasttrain.config.schema.validate already (the command-line check, which builds the
    run before Hydra writes anything and hands it to the task: fasttrain.cli)."""
    if not validated:
        validate(cfg, entry="train")
    L.seed_everything(cfg.seed, workers=True)
    datamodule = build(cfg.data, "data")
    # A data module that reads and checks its source before the trainer exists (data=text: the
    # corpus, tokenized once into memmaps): a bad one is then one line, before anything runs.
    getattr(datamodule, "prepare_before_trainer", lambda: None)()
    model = build_model(cfg.model, **model_kwargs)
    check_modes(cfg.get("callbacks"), model)
    mismatch = getattr(model, "data_mismatch", lambda _: None)(datamodule)
    if mismatch:  # e.g. model.num_targets=2 on a data set with one target per sample
        raise UserError(f"model ({cfg.model._target_}) does not fit data "
                        f"({cfg.data._target_}): {mismatch}")  # fmt: skip
    spec = plain(OmegaConf.to_container(cfg.model, resolve=True))  # a plain module's record
    every = [*build_all(cfg.get("callbacks"), "callbacks"), ResumeState(cfg.seed),
             ModelSpec(spec), *callbacks]  # fmt: skip
    if str(cfg.get("optimized_metric") or "").startswith("val/"):
        every.append(OptimizedMetric(cfg.optimized_metric))
    if cfg.trainer.get("enable_checkpointing") is False:  # no checkpoint, on a crash neither
        from fasttrain.checkpoints.crash import CrashCheckpoint

        every = [c for c in every if not isinstance(c, CrashCheckpoint)]
    loggers = build_all(cfg.get("logger"), "logger")
    for logger in loggers:  # TensorBoard's layout: the task's own charts (fasttrain.models.task)
        if hasattr(logger, "monitor"):  # its chart, its column, first (RunLogger, MLflowRun)
            logger.monitor = getattr(model, "monitor", None)
        if hasattr(logger, "task_charts"):
            logger.task_charts = dict(getattr(model, "charts", {}))
            from fasttrain.callbacks.board import task_group

            logger.group = task_group(model)  # the task's charts are its own
    extra = fsdp_wrapping(cfg.trainer.get("strategy"), model)
    trainer = build(cfg.trainer, "trainer", callbacks=every, logger=loggers or False,
                    plugins=[AtomicCheckpointIO()], **extra)  # fmt: skip
    return trainer, model, datamodule


def fsdp_wrapping(strategy: Any, model: Any) -> dict[str, Any]:
    """trainer.strategy=fsdp (trainer=fsdp) on a net that names its repeated blocks
    (`wrap_units`, e.g. GPT's Block): an FSDPStrategy that shards each block as its own unit
    (and recomputes each under model.net.activation_checkpointing=true). Lightning's plain
    "fsdp" wraps only the root: the whole model's parameters would be gathered at once."""
    units = getattr(getattr(model, "net", None), "wrap_units", None)
    if strategy != "fsdp" or not units:
        return {}
    from lightning.pytorch.strategies import FSDPStrategy

    checkpointed = set(units) if getattr(model.net, "activation_checkpointing", False) else None
    fsdp = FSDPStrategy(auto_wrap_policy=set(units), activation_checkpointing_policy=checkpointed)
    return {"strategy": fsdp}


ClipAlgorithm = Literal["norm", "value"]


def strategy_names() -> list[str]:
    import fasttrain.distributed.dp  # noqa: F401  (registers `dp`: a battery, loaded when named)

    return ["auto", *StrategyRegistry.available_strategies()]


class NoProfiler(PassThroughProfiler):
    """Lightning's default "no profiler", without its cost: Lightning wraps every hook call (each
    callback's hooks, on every step, ~80 a step with the default callbacks) in `profile()`, which
    PassThroughProfiler inherits as a generator-based context manager (~1.3 us each on a CPU
    core). Here it is one shared no-op context."""

    _nothing = contextlib.nullcontext()

    def profile(self, action_name: str) -> contextlib.nullcontext[None]:  # type: ignore[override]
        return self._nothing


# The callback and module hooks Lightning calls on every training batch.
STEP_HOOKS = ("on_train_batch_start", "on_before_backward", "on_after_backward",
              "on_before_optimizer_step", "on_before_zero_grad", "on_train_batch_end")  # fmt: skip


def skip_unused_step_hooks(obj: L.Callback | L.LightningModule) -> None:
    """Let Lightning skip the per-step hooks a callback (or the LightningModule) does not
    implement.

    Lightning calls every hook of every callback, and the module's, on every step (for each: a
    bound method, a profiler context; for a callback its `state_key`, a dict's repr for
    ModelCheckpoint), though most implement one or two of the six: with the default callbacks
    ~50 hook calls a step that do nothing. It skips a hook attribute that is not callable, so
    each unimplemented one is set to None on the instance. The class keeps its methods: a
    subclass's `super()` call still works (tests/test_hot_path.py checks that Lightning still
    skips them)."""
    base = L.LightningModule if isinstance(obj, L.LightningModule) else L.Callback
    own = getattr(obj, "__dict__", None)
    if own is None:  # __slots__ only: nowhere to put the None
        return
    for hook in STEP_HOOKS:
        # Neither the class nor the instance (a hook assigned in __init__) implements it.
        if getattr(type(obj), hook) is getattr(base, hook) and hook not in own:
            setattr(obj, hook, None)
    # A ModelCheckpoint that saves at epoch ends only (the shipped `best` and `checkpoint`)
    # returns from its batch-end hook without doing anything (~40 calls); a subclass may do more
    # there. Private: no public "every N steps" or "time interval" attribute
    # (tests/test_architecture.py).
    if (
        isinstance(obj, ModelCheckpoint)
        and type(obj).on_train_batch_end is ModelCheckpoint.on_train_batch_end
        and obj._every_n_train_steps < 1
        and obj._train_time_interval is None
    ):
        obj.on_train_batch_end = None  # type: ignore[method-assign,assignment]


class Trainer(L.Trainer):
    """lightning.Trainer with checked strategy, accumulation and clipping arguments, `NoProfiler`
    when no profiler is given, and no calls of per-step hooks that do nothing (the callbacks'
    and, in `fit`, the module's)."""

    def __init__(
        self,
        *,
        strategy: str | Strategy = "auto",
        accumulate_grad_batches: Annotated[int, AtLeast(1)] = 1,
        gradient_clip_val: Annotated[float | None, NonNegative] = None,
        gradient_clip_algorithm: ClipAlgorithm | None = None,
        # every-N counts Lightning divides by mid-fit (0: a ZeroDivisionError after the run began)
        log_every_n_steps: Annotated[int, AtLeast(1)] = 50,
        check_val_every_n_epoch: Annotated[int | None, AtLeast(1)] = 1,
        # Lightning's own checks of these are a TypeError traceback (devices=-3) or none
        # (min_epochs=-1, num_sanity_val_steps=-5 ran)
        devices: Annotated[int | list[int], AtLeast(-1, note="-1: every device")] | str = "auto",
        num_nodes: Annotated[int, AtLeast(1)] = 1,
        min_epochs: Annotated[int | None, AtLeast(0)] = None,
        min_steps: Annotated[int | None, AtLeast(0)] = None,
        num_sanity_val_steps: Annotated[int | None, AtLeast(-1, note="-1: every batch")] = None,
        reload_dataloaders_every_n_epochs: Annotated[int, AtLeast(0)] = 0,
        **kwargs: Any,
    ) -> None:
        # the arguments declared above, as given: checked here, then handed on to Lightning
        declared = {k: v for k, v in locals().items() if k not in ("self", "kwargs", "__class__")}
        named = strategy.lower() if isinstance(strategy, str) else "auto"
        known = named == "auto" or named in StrategyRegistry.available_strategies()
        if not known and named not in strategy_names():  # which registers `dp`, if named
            raise ConfigError(
                "strategy", strategy, f"expected one of {', '.join(strategy_names())}"
            )
        check_arguments(Trainer.__init__, declared)
        accelerator = kwargs.get("accelerator")
        if accelerator in ("gpu", "cuda") and not _gpu_available():
            raise ConfigError(
                "accelerator",
                accelerator,
                "needs a GPU and none is visible here (trainer=gpu, ddp "
                "and fsdp need one); use trainer=cpu, or trainer=ddp_cpu for DDP on CPU processes",
            )
        if kwargs.get("val_check_interval") == 0:  # an int 0: Lightning divides by it mid-fit
            raise ConfigError("val_check_interval", 0, VAL_CHECK_VALID)
        if kwargs.get("profiler") is None:
            kwargs["profiler"] = NoProfiler()
        super().__init__(**declared, **kwargs)
        # Those given and those Lightning added (model summary); its stubs lack `callbacks`.
        for callback in self.callbacks:  # type: ignore[attr-defined]
            skip_unused_step_hooks(callback)
            if isinstance(callback, ModelCheckpoint):  # a resumed state names only its files
                confine_restored_paths(callback)

    def fit(self, model: L.LightningModule, *args: Any, **kwargs: Any) -> None:
        if isinstance(model, L.LightningModule):  # anything else: Lightning's own error
            skip_unused_step_hooks(model)
        try:
            super().fit(model, *args, **kwargs)
        except (ValueError, RuntimeError, MisconfigurationException) as error:
            past = _val_check_past_the_epoch(self, error)
            raise past or never_logged(self, error) or error from error


# What trainer.val_check_interval takes (Lightning's Trainer), said when it is refused.
VAL_CHECK_VALID = (
    "expected an int >= 1 (training batches), a fraction of an epoch in [0.0, 1.0], "
    "a time 'DD:HH:MM:SS', or null (once an epoch)"
)


def _val_check_past_the_epoch(trainer: L.Trainer, error: Exception) -> UserError | None:
    """`error` as an int val_check_interval over an epoch's training batches, which Lightning
    refuses when the epoch's loader is first read (inside fit: a ValueError and a traceback),
    said as the override that fixes it; None for any other error. Lightning's own condition,
    read from the trainer's state."""
    every, batches = trainer.val_check_interval, trainer.fit_loop.max_batches
    if not isinstance(error, ValueError) or "val_check_interval" not in str(error):
        return None
    if not isinstance(every, int) or trainer.check_val_every_n_epoch is None:
        return None
    if not isinstance(batches, int) or every <= batches:
        return None
    expected = (
        f"expected at most {batches}, the training batches of an epoch here, or a fraction of "
        "an epoch in [0.0, 1.0]; trainer.check_val_every_n_epoch=null counts it across epochs"
    )
    return ConfigError("val_check_interval", every, expected).at("trainer")


def _gpu_available() -> bool:
    """What Lightning's accelerator="gpu" can run on: a CUDA or an Apple MPS device."""
    from lightning.pytorch.accelerators import CUDAAccelerator, MPSAccelerator

    return CUDAAccelerator.is_available() or MPSAccelerator.is_available()
