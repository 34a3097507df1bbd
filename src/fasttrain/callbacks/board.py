"""What TensorBoard shows of a run, arranged so that it answers the usual questions at a glance.

- `RunLogger`: Lightning's TensorBoardLogger writing its events into the run folder itself, so
  TensorBoard lists the run as `<task>/<time>_<overrides>`; without Lightning's `epoch` scalar
  (the Time Series page would open on its staircase); with a Custom Scalars layout (`LAYOUT`:
  train vs val loss and accuracy on one chart each, throughput, data wait, memory, learning
  rate, total gradient norm).
- `LearningRate`: the learning rate, the one place it is logged.
- `start_session` / `end_session`: the run's HPARAMS session, written when it starts (a killed
  run is listed too) and closed with `final/*` scalars at its last step.
- `compared_hparams`: what that session lists: the knobs people compare and the overrides.

One step convention for every scalar: x is the number of optimizer steps completed when the
value was measured (`trainer.global_step`). Values logged every N steps land on multiples of N:
the training loss, the learning rate and gradient norms at the start of steps 0, N, 2N, ...
(before that step's update), throughput over the N steps that end at N, 2N, ...; validation and
test values at the step where they were measured.
"""

from __future__ import annotations

import json
import re
import time
import urllib.parse
from collections.abc import Collection, Mapping, Sequence
from typing import Any, cast

import lightning as L
from lightning.pytorch.loggers import Logger, TensorBoardLogger

Value = bool | int | float | str

# Custom Scalars: categories and charts in the order shown; each chart a list of tag regexes.
LAYOUT: dict[str, dict[str, list[Any]]] = {
    "training": {
        "loss: train vs val": ["Multiline", [r"^train/loss_(step|epoch)$", r"^val/loss$"]],
        "learning rate": ["Multiline", [r"^lr(/.*)?$"]],
        "gradient norm (total, before clipping)": ["Multiline", [r"^grad_norm/total$"]],
    },
    "speed": {
        "throughput (samples/s)": ["Multiline", [r"^perf/samples_per_sec$"]],
        "share of step time waiting for data": ["Multiline", [r"^perf/data_wait_share$"]],
        "step time (ms)": ["Multiline", [r"^perf/step_time_ms$"]],
        "CPU use (%)": ["Multiline", [r"^perf/cpu_util_pct$"]],
    },
}
# Logged on CUDA only (fasttrain.callbacks.perf): a chart of them on a CPU run would stay empty.
CUDA_LAYOUT: dict[str, list[Any]] = {
    "device memory (GB)": ["Multiline", [r"^perf/(mem_allocated_gb|mem_peak_gb|gpu_mem_used_gb)$"]],
    "MFU and GPU use": ["Multiline", [r"^perf/mfu$", r"^perf/gpu_util_pct$"]],
}


def layout(
    cuda: bool, charts: Mapping[str, Sequence[str]] | None = None
) -> dict[str, dict[str, list[Any]]]:
    """The Custom Scalars layout of a run: the task's `charts` (title -> tag regexes) after the
    loss chart; the memory and MFU charts where they are logged."""
    loss, *rest = LAYOUT["training"].items()
    own = [(title, ["Multiline", list(tags)]) for title, tags in (charts or {}).items()]
    chosen = {**LAYOUT, "training": dict([loss, *own, *rest])}
    if cuda:
        chosen["speed"] = {**LAYOUT["speed"], **CUDA_LAYOUT}
    return chosen


class RunLogger(TensorBoardLogger):
    """TensorBoardLogger writing into `save_dir` itself (no name/version subfolders), without the
    `epoch` scalar Lightning adds to every logging call, and with the Custom Scalars layout.

    Args:
        save_dir: the run folder.
        log_graph: also write the model's graph (Lightning's option).
        flush_secs: how often pending events are written to disk.
    """

    def __init__(self, save_dir: str, log_graph: bool = False, flush_secs: int = 120) -> None:
        # No `hp_metric` scalar of -1: the HPARAMS session is start_session's.
        super().__init__(save_dir, name="", version="", log_graph=log_graph,
                         default_hp_metric=False, flush_secs=flush_secs)  # fmt: skip
        # The task's own charts (fasttrain.models.task `charts`), set by whoever builds the run
        # (fasttrain.assemble.build_run) before the first event is written.
        self.task_charts: dict[str, list[str]] = {}

    @property
    def experiment(self) -> Any:
        fresh = self._experiment is None
        writer = super().experiment
        if fresh and self._experiment is not None:  # just created, on rank zero
            import torch

            writer.add_custom_scalars(layout(torch.cuda.is_available(), self.task_charts))
        return writer

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        super().log_metrics({k: v for k, v in metrics.items() if k != "epoch"}, step)


class LearningRate(L.Callback):
    """Logs `lr` (with several parameter groups `lr/0`, `lr/1`, ...) at the start of every
    `trainer.log_every_n_steps`-th optimizer step: the rate that step's update uses. A host
    float read from the optimizer: no device sync."""

    def __init__(self) -> None:
        super().__init__()
        self._last = -1

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        every = max(1, trainer.log_every_n_steps)  # type: ignore[attr-defined]
        if step % every or step == self._last or not trainer.optimizers:
            return  # also the later micro-batches of an accumulated step
        self._last = step
        groups = trainer.optimizers[0].param_groups
        if len(groups) == 1:
            values = {"lr": float(groups[0]["lr"])}
        else:
            values = {f"lr/{i}": float(g["lr"]) for i, g in enumerate(groups)}
        for logger in trainer.loggers:
            logger.log_metrics(values, step=step)


# ---- HPARAMS -------------------------------------------------------------------------------
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


def pinned_tags(monitor: str | None, logged: Collection[str]) -> list[str]:
    """The charts the Time Series view opens on, two to a row: training vs validation loss,
    then the monitored metric beside its training twin (train/<name> beside val/<name>).

    TensorBoard orders the groups below alphabetically and opens the first two; pinned cards
    come before them all, and a link can carry them (`view_url`).
    """
    wanted = ["train/loss_step", "val/loss"]
    if monitor and monitor != "val/loss":
        wanted += ["train/" + monitor.split("/", 1)[-1], monitor]
    # The per-step loss goes straight to the loggers (fasttrain.models.task), past `logged`.
    present = {*logged, "train/loss_step"} if "train/loss_epoch" in logged else set(logged)
    return [tag for tag in wanted if tag in present]


def view_url(tags: Sequence[str], port: int = 6006) -> str:
    """TensorBoard's Time Series page with `tags` pinned first (its `pinnedCards` link)."""
    cards = json.dumps([{"plugin": "scalars", "tag": t} for t in tags], separators=(",", ":"))
    return f"http://127.0.0.1:{port}/?pinnedCards={urllib.parse.quote(cards)}#timeseries"


def trial_id(run_name: str) -> str:
    """The HPARAMS table's "Trial ID": the run folder's name without the date, so that what
    tells runs apart (the time to the second, then the overrides) shows at its default width:
    `2026-01-31_12-00-00_seed=1` -> `12-00-00_seed=1`; a sweep job's `3_seed=1` stays."""
    return re.sub(r"^\d{4}-\d{2}-\d{2}_", "", run_name)


def _writers(loggers: Sequence[Logger]) -> list[Any]:
    # The TensorBoard loggers' SummaryWriters, on rank zero only (elsewhere a dummy). torch's
    # SummaryWriter has no public call that writes a prepared Summary; `_get_file_writer` is the
    # one Lightning's own TensorBoardLogger.log_hyperparams uses (tests/test_tensorboard.py
    # reads the sessions back, so a change there fails loudly).
    tb = [lg for lg in loggers if isinstance(lg, TensorBoardLogger)]
    writers = [lg.experiment for lg in tb]
    # On ranks > 0 `experiment` is Lightning's dummy, whose every method returns None.
    files = [w._get_file_writer() for w in writers if hasattr(w, "_get_file_writer")]
    return [f for f in files if f is not None]


def start_session(loggers: Sequence[Logger], hparams: Mapping[str, Value], trial: str) -> None:
    """The HPARAMS session of this run, written before training: a run killed later is listed
    too, its metrics (the last value of each scalar) as far as it got. A resumed run writes it
    again into the same folder; TensorBoard keeps the first, so the run stays one session."""
    from tensorboard.plugins.hparams.summary_v2 import hparams_pb

    summary = hparams_pb(dict(hparams), trial_id=trial, start_time_secs=time.time())
    for writer in _writers(loggers):
        writer.add_summary(summary)
        writer.flush()


def end_session(loggers: Sequence[Logger], final: Mapping[str, float], step: int) -> None:
    """The run's final values as `final/<name>` scalars at its last step (the HPARAMS tab's
    metric columns), and the session closed as a success with its end time."""
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


def session_of(cfg: Any, trainer: L.Trainer) -> tuple[dict[str, Value], str]:
    """The HPARAMS columns and trial ID of the run `cfg` configures (the overrides as typed on
    the command line, less those the run's name leaves out: paths, run_name, ...)."""
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from fasttrain.config.settings import run_tags

    overrides: list[str] = []
    if HydraConfig.initialized():  # a command line; tests compose configs without one
        hc = HydraConfig.get()
        excluded = set(hc.job.config.override_dirname.exclude_keys)
        overrides = [o for o in hc.overrides.task if _key(o) not in excluded]
    batch = OmegaConf.select(cfg, "data.batch_size")
    extra: dict[str, Any] = {}
    choice = HydraConfig.get().runtime.choices.get("data") if HydraConfig.initialized() else None
    if choice:  # the data set by its option's name ("digits"), else by its class
        extra["data"] = choice
    tags = run_tags(cfg.get("tags"))
    if tags:  # one column, as typed: tags=[a,b] -> "a,b"
        extra["tags"] = ",".join(tags)
    if isinstance(batch, int):
        extra["effective_batch_size"] = batch * trainer.accumulate_grad_batches * trainer.world_size
    config = cast(Mapping[str, Any], OmegaConf.to_container(cfg, resolve=True))
    return compared_hparams(config, overrides, extra), trial_id(Path(cfg.paths.output_dir).name)


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
