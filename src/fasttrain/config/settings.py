"""The top-level keys of each entry config (conf/train.yaml, eval.yaml, export.yaml,
predict.yaml), written as typed signatures: fasttrain.config.schema checks them like any
component's arguments (unknown keys, types, choices, declared domains), then calls the
function for the rules across values a signature cannot say. Group nodes (data, model,
trainer, ...) are checked on their own.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from fasttrain.config import domains
from fasttrain.config.domains import AtLeast, Range
from fasttrain.config.errors import ConfigError, UserError

MatmulPrecision = Literal["highest", "high", "medium"]
BatchSizeMode = Literal["power", "binsearch"]
Device = Literal["auto", "cpu", "cuda"]
ExportFormat = Literal["onnx", "torchscript", "int8", "fp16", "all"]  # fasttrain.deploy.formats
SEED_MAX = 2**32 - 1  # numpy's and Lightning's seed range
# Scheduler arguments that give a schedule's length (CosineAnnealingLR, OneCycleLR): left out of
# the scheduler config, the task (fasttrain.models.optim_plan) sets them to the run's length.
RUN_LENGTH_ARGS = ("T_max", "total_steps")


def tuner(lr_find: bool = False, batch_size: BatchSizeMode | None = None) -> None:
    """`tuner:` of conf/train.yaml (Lightning's LR and batch-size finders, run before fit)."""


Folder = Annotated[str, domains.Folder()]


def paths(root_dir: Folder, data_dir: Folder, log_dir: Folder, output_dir: Folder,
          **more: Any) -> None:  # fmt: skip
    """`paths:` (conf/paths/default.yaml): each a folder to write into, none empty (an empty
    log_dir put runs under /). A project's own keys beside them are its business."""


# The plain groups (no _target_) each entry config may hold, checked like a signature.
GROUPS: dict[str, Callable[..., None]] = {"tuner": tuner, "paths": paths}


def check_training_batches(train: bool, trainer: dict[str, Any] | None) -> None:
    """With train=true, a run that trains on no batch would test an untrained model as its
    result: refuse it (train=false is the way to test a model untrained)."""
    if not train:
        return
    for knob, valid in _RUN_LENGTH_VALID.items():
        value = (trainer or {}).get(knob)
        if value is not None and not isinstance(value, bool) and value == 0:
            raise UserError(
                f"trainer.{knob}={value}: no training batch would run and the untrained "
                f"model would be tested as this run's result; {valid}, or train=false to test "
                "the model untrained"
            )
    max_time = (trainer or {}).get("max_time")
    if _duration_seconds(max_time) <= 0:  # Lightning's Timer stops at its first check
        raise UserError(
            f"trainer.max_time={max_time}: training would stop at once and the barely trained "
            "model would be tested as this run's result; set a duration > 0 (DD:HH:MM:SS, "
            "e.g. 00:12:00:00), null for no time limit, or train=false"
        )


def _duration_seconds(value: Any) -> float:
    """trainer.max_time in seconds, as Lightning's Timer reads it ("DD:HH:MM:SS" or a mapping
    of timedelta's arguments); inf where it is none (null; Lightning says what else is)."""
    import datetime

    try:
        if isinstance(value, str):
            days, hours, minutes, secs = map(int, value.split(":"))
            value = {"days": days, "hours": hours, "minutes": minutes, "seconds": secs}
        return datetime.timedelta(**value).total_seconds()
    except (TypeError, ValueError, OverflowError):  # null, or Lightning's to refuse
        return float("inf")


# The knobs whose 0 trains nothing (Lightning stops at once, then the run tests), and their use.
_RUN_LENGTH_VALID = {
    "limit_train_batches": "set it > 0 (an int of batches or a fraction of them)",
    "max_epochs": "set it >= 1, or -1 for no epoch limit",
    "max_steps": "set it >= 1, or -1 for no step limit",
}


def check_schedule_length(model: dict[str, Any] | None, trainer: dict[str, Any] | None) -> None:
    """A schedule whose length the run sets needs a run of known length in its unit: epochs
    (model.scheduler_interval=epoch) or optimizer steps (=step). Checked again by the task;
    here it fails before a run folder exists."""
    scheduler = (model or {}).get("scheduler")
    if not isinstance(scheduler, dict) or any(a in scheduler for a in RUN_LENGTH_ARGS):
        return
    trainer = trainer or {}
    max_epochs, max_steps = trainer.get("max_epochs"), trainer.get("max_steps", -1)
    bounded_by_steps = max_steps not in (None, -1)
    # Lightning's reading of the two: max_epochs=None means 1000 epochs unless max_steps is set.
    no_epochs = max_epochs == -1 or (max_epochs is None and bounded_by_steps)
    interval = (model or {}).get("scheduler_interval", "epoch")
    if interval == "epoch" and no_epochs:
        raise UserError(
            f"model.scheduler_interval=epoch: the lr schedule runs over epochs but "
            f"trainer.max_epochs={max_epochs} sets no number of epochs; set trainer.max_epochs, "
            "or model.scheduler_interval=step to schedule over the run's optimizer steps "
            "(trainer.max_steps)"
        )
    if interval == "step" and max_epochs == -1 and not bounded_by_steps:
        raise UserError(
            "model.scheduler_interval=step: the lr schedule needs the run's length, but "
            "trainer.max_epochs=-1 and no trainer.max_steps bound the run; set one of them"
        )


def check_precision_and_processes(
    trainer: dict[str, Any] | None,
    model: dict[str, Any] | None,
    tuner: dict[str, Any] | None,
    oom_fallback: bool,
) -> None:
    """Settings each valid alone that fail together, refused before a run folder exists:
    an Adam-style eps that rounds to 0 in fp16 weights (NaN at the first step), and the
    one-process tools (batch-size finder, OOM fallback) under a multi-process strategy."""
    trainer, tuner = trainer or {}, tuner or {}
    optimizer = (model or {}).get("optimizer") or {}
    name = str(optimizer.get("_target_", "")).rsplit(".", 1)[-1]
    eps = optimizer.get("eps", 1e-8)
    # 6.1e-5 is fp16's smallest normal number; Adam's default eps (1e-8) rounds to 0 in fp16.
    if str(trainer.get("precision")) in ("16-true", "16") and "Adam" in name and eps < 6.1e-5:
        raise UserError(
            f"trainer.precision={trainer['precision']}: {name} with eps={eps:g} keeps fp16 "
            "weights whose update divides by 0 (NaN at the first step); use "
            "trainer.precision=16-mixed (fp32 weights), bf16-mixed or bf16-true"
        )
    strategy, devices = str(trainer.get("strategy", "auto")), trainer.get("devices", 1)
    nodes = trainer.get("num_nodes") or 1
    count = (
        len(devices) if isinstance(devices, list) else devices if isinstance(devices, int) else 1
    )
    multi = strategy.startswith(("ddp", "fsdp", "deepspeed")) or nodes > 1
    multi = multi or (count > 1 and strategy != "dp")
    where = f"trainer.strategy={strategy} (devices={devices}, num_nodes={nodes})"
    if multi and tuner.get("batch_size") is not None:
        raise UserError(
            f"tuner.batch_size={tuner['batch_size']}: the batch-size finder runs in one process, "
            f"not under {where}; set data.batch_size yourself, or find it in one process "
            "first (trainer=gpu or trainer=cpu)"
        )
    if multi and oom_fallback:
        raise UserError(
            f"oom_fallback=true works in one process only, not under {where}: a rank that "
            "halved its batch alone would fall out of step; set a smaller data.batch_size instead"
        )


Seed = Annotated[int, Range(0, SEED_MAX)]


RunName = Annotated[str, domains.Folder(inside="logs/<task>/")]
OutputDir = Annotated[str | None, domains.Folder()]


def train(
    task_name: str,
    run_name: RunName,
    seed: Seed,
    matmul_precision: MatmulPrecision | None = "high",
    oom_fallback: bool = False,
    tuner: dict[str, Any] | None = None,
    train: bool = True,
    test: bool = True,
    resume: str = "auto",
    optimized_metric: str | None = None,
    tags: Any = None,
    trainer: dict[str, Any] | None = None,
    model: dict[str, Any] | None = None,
) -> None:
    """`trainer` and `model` are component nodes, checked on their own; only what depends on
    two keys at once (train and the trainer's limits, the schedule and the run's length) is
    checked here, before a run folder exists."""
    check_training_batches(train, trainer)
    check_schedule_length(model, trainer)
    check_precision_and_processes(trainer, model, tuner, oom_fallback)
    if not resume:
        raise ConfigError("resume", resume, "expected never, auto or a checkpoint path")
    run_tags(tags)


# What every tracker takes as a tag: MLflow's tag keys, W&B's 64-character tags.
TAG = re.compile(r"[\w.\-/ ]{1,64}")


def run_tags(tags: Any) -> list[str]:
    """`tags=[baseline,lr-sweep]` (or one `tags=baseline`) as the list every tracker records."""
    listed = [tags] if isinstance(tags, str) else list(tags or [])
    if not all(isinstance(t, str) and TAG.fullmatch(t) for t in listed):
        expected = ("expected a list of names of letters, digits and _ . - / or space, at most "
                    "64 characters each: tags=[baseline,sweep1]")  # fmt: skip
        raise ConfigError("tags", tags, expected)
    return listed


def evaluate(task_name: str, run_name: RunName, seed: Seed, ckpt_path: str) -> None:
    """conf/eval.yaml"""


def export(
    task_name: str,
    run_name: RunName,
    seed: Seed,
    ckpt_path: str,
    format: ExportFormat = "all",
    output_dir: OutputDir = None,
    device: Device = "auto",
    latency_time: Annotated[float, Range(0, low_open=True, what="seconds")] = 0.2,
    strict: bool = True,
) -> None:
    """conf/export.yaml"""


def predict(
    task_name: str,
    run_name: RunName,
    seed: Seed,
    ckpt_path: str,
    input: str | None = None,
    output_dir: OutputDir = None,
    device: Device = "auto",
    prompt: str | None = None,
    max_new_tokens: Annotated[int, AtLeast(1)] = 200,
    temperature: Annotated[
        float, Range(0, what="a finite number", note="0: the most likely token")
    ] = 0.8,
    top_k: Annotated[int | None, AtLeast(1, null="every token")] = 50,
    kv_cache: bool = True,
) -> None:
    """conf/predict.yaml"""
    if prompt is not None and input is not None:
        raise ConfigError("input", input, "a language model's prompt= takes no input file")


def prepare(
    task_name: str, run_name: RunName, seed: Seed, output_dir: OutputDir = None,
    shard_size: Annotated[int, AtLeast(1, note="samples per shard")] = 1000,
) -> None:  # fmt: skip
    """conf/prepare.yaml"""
    out = Path(output_dir).expanduser() if output_dir else None
    if out is not None and out.is_dir() and any(out.iterdir()):
        raise ConfigError("output_dir", output_dir, "exists and is not empty; choose a new folder")


def check_pairing(cfg: Any) -> None:
    """The model and data groups fit together: a value one takes from the other (the
    classifier's `${data.num_classes}`, a regression task's `${data.num_targets}`) exists. One
    line instead of OmegaConf's traceback when, e.g., a task meets a data set of another kind."""
    from omegaconf import DictConfig, OmegaConf
    from omegaconf.errors import InterpolationKeyError, InterpolationResolutionError

    for group in ("data", "model"):
        if isinstance(cfg.get(group), DictConfig):
            try:
                OmegaConf.to_container(cfg[group], resolve=True)
            except InterpolationResolutionError as err:
                cause = _user_error_behind(err)
                if isinstance(cause, ConfigError):  # a resolver's check: data.path=X: no such..
                    raise cause.at(group) from None
                if isinstance(cause, UserError):
                    raise UserError(str(cause)) from None
                if not isinstance(err, InterpolationKeyError):
                    raise
                wanted = re.search(r"'([^']+)'", str(err.msg))
                key = wanted.group(1) if wanted else str(err.msg)
                raise UserError(
                    f"{err.full_key}: takes ${{{key}}}, which the selected data set does not "
                    f"set ({_target_of(cfg, 'data')}); model= and data= must be of one kind "
                    "(class labels: num_classes, regression targets: num_targets, token "
                    "windows: vocab_size; e.g. model=gpt data=text)"
                ) from None


def _user_error_behind(err: BaseException) -> BaseException | None:
    """The UserError a resolver raised, which OmegaConf keeps only as the exception's context."""
    seen: BaseException | None = err
    while seen is not None and not isinstance(seen, UserError):
        seen = seen.__cause__ or seen.__context__
    return seen


def _target_of(cfg: Any, group: str) -> str:
    from omegaconf import OmegaConf

    return str(OmegaConf.select(cfg, f"{group}._target_", default="none"))


# config name (conf/<name>.yaml) -> its top-level keys
ENTRIES: dict[str, Callable[..., None]] = {
    "train": train,
    "eval": evaluate,
    "export": export,
    "predict": predict,
    "prepare": prepare,
}
