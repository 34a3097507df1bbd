"""The run's HPARAMS session in TensorBoard: which hyperparameters it lists, its trial ID, when it
is written and closed, and its final values.

- `compared_hparams`: the knobs people compare and the overrides given, typed, no plumbing.
- `session_of`: a run's columns and trial ID, from its config and command line.
- `start_session` / `end_session`: the session written when the run starts, in a run of its own
  (`<run>/hparams`, fasttrain.callbacks.board.SESSION_RUN), so that a killed run is listed too,
  and closed at its last step with the final values (`final_values`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from fasttrain.callbacks.board import RunLogger

Value = bool | int | float | str

# The knobs every session lists, by the override that sets them; a `_target_` is shown as its
# class name ("AdamW"). Overrides that differ from the defaults come on top (`compared_hparams`).
KNOBS = (
    "data._target_", "data.batch_size", "model.net._target_", "model.optimizer._target_",
    "model.optimizer.lr", "trainer.precision", "trainer.strategy", "trainer.devices",
    "trainer.accumulate_grad_batches", "trainer.gradient_clip_val", "trainer.max_epochs", "seed",
)  # fmt: skip
MAX_HPARAMS = 25
# Where files go and what only wires things together: never a column.
_PLUMBING = re.compile(
    r"(^|\.)(_target_|_partial_)$|^paths\.|^hydra\.|(^|[._])(dir|path|file|filename|dirpath)$"
)


def compared_hparams(config: Mapping[str, Any], overrides: Sequence[str] = (),
                     extra: Mapping[str, Any] | None = None) -> dict[str, Value]:  # fmt: skip
    """The HPARAMS columns of a run: `extra` (derived values, e.g. effective_batch_size), the
    overrides given (`model/net=mlp` as the option's name, `key=value` as the config's typed
    value), then the fixed KNOBS; at most MAX_HPARAMS, no `_target_`, paths or plumbing.

    `config` is the resolved config as plain containers; values keep their type (bool, int,
    float, str); a list becomes its text and a null is left out (shown as empty).
    """
    chosen: dict[str, Any] = dict(extra or {})
    for key, option in _override_keys(overrides):
        if key in chosen:  # given in `extra` already (the data set's name, the tags)
            continue
        value = _select(config, key)
        # A group choice (`model/net=mlp`, or `model=mlp` for a top-level group whose node is
        # the composed config): the option's name, not hundreds of characters of config.
        if "/" in key or isinstance(value, Mapping):
            chosen[key] = option
        elif not _PLUMBING.search(key):
            chosen[key] = value
    for key in KNOBS:
        value = _select(config, key)
        if key.endswith("._target_") and value is not _MISSING:
            key, value = key.removesuffix("._target_") or key, str(value).rsplit(".", 1)[-1]
        chosen.setdefault(key, value)
    typed = {k: _typed(v) for k, v in chosen.items() if v is not None and v is not _MISSING}
    return dict(list(typed.items())[:MAX_HPARAMS])


_MISSING = object()


def _override_keys(overrides: Sequence[str]) -> list[tuple[str, str]]:
    """(key, the value as typed) of each override (`model/net=mlp` -> ("model/net", "mlp"));
    deletions (`~key`) left out, sweeps' syntax read by Hydra's own parser."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    found: list[tuple[str, str]] = []
    for o in OverridesParser.create().parse_overrides(list(overrides)):
        if not o.is_delete():
            found.append((o.key_or_group, str(o.value())))
    return found


def _select(config: Mapping[str, Any], key: str) -> Any:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _typed(value: Any) -> Value:
    return value if isinstance(value, (bool, int, float, str)) else str(value)


def trial_id(output_dir: Path) -> str:
    """The HPARAMS table's "Trial ID", unique in the log folder (TensorBoard merges the sessions
    of one ID into one row of averaged results): the run folder's name, its overrides first
    (`lr=0.01,seed=1_0131-120005`); a sweep job's as its sweep's time and job,
    `multirun/0131-120005/3_seed=1` -> `0131-120005/3_seed=1` (two sweeps' `3_seed=1` are two
    trials). Folders named before the overrides came first (`2026-01-31_12-00-00_seed=1`) lose
    their date, shared by the day's runs: `12-00-00_seed=1`."""
    run = _without_date(output_dir.name)
    if output_dir.parent.parent.name == "multirun":
        return f"{_without_date(output_dir.parent.name)}/{run}"
    return run


def _without_date(name: str) -> str:
    return re.sub(r"^\d{4}-\d{2}-\d{2}_", "", name)


def _writers(loggers: Sequence[Logger]) -> list[Any]:
    # The file writers of the HPARAMS session's run, on rank zero only: a RunLogger's session
    # run, another TensorBoardLogger's own folder. torch's SummaryWriter has no public call that
    # writes a prepared Summary; `_get_file_writer` is the one Lightning's own
    # TensorBoardLogger.log_hyperparams uses (tests/test_tensorboard.py reads the sessions back,
    # so a change there fails loudly).
    if getattr(rank_zero_only, "rank", 0) != 0:
        return []
    tb = [lg for lg in loggers if isinstance(lg, TensorBoardLogger)]
    writers = [lg.session_writer if isinstance(lg, RunLogger) else lg.experiment for lg in tb]
    return [w._get_file_writer() for w in writers]


def start_session(loggers: Sequence[Logger], hparams: Mapping[str, Value], trial: str) -> None:
    """The HPARAMS session of this run, written before training: a run killed later is listed
    too, its metrics as far as it got (RunLogger writes them as validation logs them). A
    resumed run writes it again into the same folder; TensorBoard keeps the first, so the run
    stays one session."""
    from tensorboard.plugins.hparams.summary_v2 import hparams_pb

    summary = hparams_pb(dict(hparams), trial_id=trial, start_time_secs=time.time())
    for writer in _writers(loggers):
        writer.add_summary(summary)
        writer.flush()


def end_session(loggers: Sequence[Logger], final: Mapping[str, float], step: int) -> None:
    """The run's final values at its last step (the HPARAMS tab's metric columns: `verdict/*`
    in TensorBoard), and the session closed as a success with its end time."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    for logger in loggers:
        if isinstance(logger, TensorBoardLogger):
            logger.log_metrics({f"final/{k}": float(v) for k, v in final.items()}, step=step)
    end = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=time.time())
    data = plugin_data_pb2.HParamsPluginData(session_end_info=end)
    summary = Summary()
    summary.value.add(tag=metadata.SESSION_END_INFO_TAG, tensor=metadata.NULL_TENSOR,
                      metadata=metadata.create_summary_metadata(data))  # fmt: skip
    for writer in _writers(loggers):
        writer.add_summary(summary, global_step=step)
        writer.flush()
    for logger in loggers:
        if isinstance(logger, RunLogger):
            logger.close_session()


def session_of(config: Mapping[str, Any], trainer: L.Trainer) -> tuple[dict[str, Value], str]:
    """The HPARAMS columns and trial ID of the run `config` (resolved, plain) configures (the
    overrides as typed on the command line, less those the run's name leaves out: paths,
    run_name, ...)."""
    from hydra.core.hydra_config import HydraConfig

    from fasttrain.config.settings import run_tags

    overrides: list[str] = []
    if HydraConfig.initialized():  # a command line; tests compose configs without one
        hc = HydraConfig.get()
        excluded = set(hc.job.config.override_dirname.exclude_keys)
        overrides = [o for o in hc.overrides.task if _key(o) not in excluded]
    batch = (config.get("data") or {}).get("batch_size")
    extra: dict[str, Any] = {}
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    for group in ("data", "model"):
        # By the option's name ("digits", "cnn"), given or not: parallel coordinates draw only
        # the sessions that have every column shown, so a default run has these columns too.
        if choices.get(group):
            extra[group] = choices[group]
    tags = run_tags(config.get("tags"))
    if tags:  # one column, as typed: tags=[a,b] -> "a,b"
        extra["tags"] = ",".join(tags)
    if isinstance(batch, int):
        extra["effective_batch_size"] = batch * trainer.accumulate_grad_batches * trainer.world_size
    return compared_hparams(config, overrides, extra), trial_id(Path(config["paths"]["output_dir"]))


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def final_values(metrics: Mapping[str, float], trainer: L.Trainer) -> dict[str, float]:
    """The run's answers for the HPARAMS tab: the final val/ and test/ metrics and the
    performance summary of fasttrain.callbacks.perf (samples/s, data-wait share, peak memory,
    MFU where known) under perf/."""
    from fasttrain.callbacks.perf import PerfMonitor

    final = {k: float(v) for k, v in metrics.items() if k.startswith(("val/", "test/"))}
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(callback, PerfMonitor):
            summary = callback.summary
            for key in ("samples_per_sec", "data_wait_share", "step_time_ms_median",
                        "mem_peak_gb", "host_peak_rss_gb", "mfu"):  # fmt: skip
                if isinstance(summary.get(key), (int, float)):
                    final[f"perf/{key}"] = float(summary[key])
    return final
