"""The top-level keys of each entry config (conf/train.yaml, eval.yaml, export.yaml,
predict.yaml), written as typed signatures: fasttrain.config.schema checks them like any
component's arguments (unknown keys, types, choices), then calls the function for the range
checks a type cannot say. Group nodes (data, model, trainer, ...) are checked on their own.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, Literal

from fasttrain.config.errors import ConfigError, UserError

MatmulPrecision = Literal["highest", "high", "medium"]
BatchSizeMode = Literal["power", "binsearch"]
Device = Literal["auto", "cpu", "cuda"]
SEED_MAX = 2**32 - 1  # numpy's and Lightning's seed range
NAME_MAX = 255  # bytes in one file name on common file systems


def check_run_name(run_name: str) -> None:
    """A run folder stays inside logs/<task>/: no empty name, no `.`/`..` part, no absolute path."""
    parts = PurePosixPath(run_name).parts
    if not run_name.strip() or run_name.startswith("/") or any(p in (".", "..") for p in parts):
        raise ConfigError("run_name", run_name, "expected a folder name inside logs/<task>/")
    if any(len(part.encode()) > NAME_MAX for part in parts):
        raise ConfigError("run_name", run_name, f"expected at most {NAME_MAX} bytes per folder")


def check_tuner(lr_find: bool = False, batch_size: BatchSizeMode | None = None) -> None:
    """`tuner:` of conf/train.yaml (Lightning's LR and batch-size finders, run before fit)."""
    if not isinstance(lr_find, bool):
        raise ConfigError("lr_find", lr_find, "expected true or false")
    if batch_size not in (None, "power", "binsearch"):
        raise ConfigError("batch_size", batch_size, "expected one of power, binsearch or null")


def run(task_name: str, run_name: str, seed: int) -> None:
    """Keys every entry has."""
    if not 0 <= seed <= SEED_MAX:
        raise ConfigError("seed", seed, f"expected an int from 0 to {SEED_MAX}")
    check_run_name(run_name)


def train(
    task_name: str,
    run_name: str,
    seed: int,
    matmul_precision: MatmulPrecision | None = "high",
    oom_fallback: bool = False,
    tuner: dict[str, Any] | None = None,
    train: bool = True,
    test: bool = True,
    resume: str = "auto",
    optimized_metric: str | None = None,
) -> None:
    run(task_name, run_name, seed)
    try:
        check_tuner(**(tuner or {}))
    except ConfigError as err:
        raise err.at("tuner") from None
    except TypeError:
        keys = ", ".join(sorted(tuner or {}))
        raise UserError(f"tuner: unknown key among {keys}; valid: lr_find, batch_size") from None
    if not resume:
        raise ConfigError("resume", resume, "expected never, auto or a checkpoint path")


def evaluate(task_name: str, run_name: str, seed: int, ckpt_path: str) -> None:
    run(task_name, run_name, seed)


def export(
    task_name: str,
    run_name: str,
    seed: int,
    ckpt_path: str,
    format: str = "all",
    output_dir: str | None = None,
    device: Device = "auto",
    latency_time: float = 0.2,
    strict: bool = True,
) -> None:
    run(task_name, run_name, seed)
    if not latency_time > 0:
        raise ConfigError("latency_time", latency_time, "expected seconds > 0")


def predict(
    task_name: str,
    run_name: str,
    seed: int,
    ckpt_path: str,
    input: str | None = None,
    output_dir: str | None = None,
    device: Device = "auto",
) -> None:
    run(task_name, run_name, seed)


# config name (conf/<name>.yaml) -> its top-level keys
ENTRIES = {"train": train, "eval": evaluate, "export": export, "predict": predict}
