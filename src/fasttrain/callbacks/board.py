"""What TensorBoard shows of a run, arranged so that it answers the usual questions at a glance.

- `RunLogger`: Lightning's TensorBoardLogger writing its events into the run folder itself, so
  TensorBoard lists the run as `<entry>/<run_name>` (`train/2026-01-31_12-00-00_seed=1`), its
  training and validation curves in that one run (one colour per run); without Lightning's
  `epoch` scalar (the Time Series page would open on its staircase); with a Custom Scalars
  layout (`LAYOUT`: train vs val loss and the task's own charts, throughput, data wait, memory,
  learning rate, total gradient norm).
- `LearningRate`: the learning rate, the one place it is logged.
- `start_session` / `end_session`: the run's HPARAMS session, in a run of its own
  (`<run>/hparams`), written when the run starts (a killed run is listed too) and closed at its
  last step.
- `compared_hparams`: what that session lists: the knobs people compare and the overrides.

One naming scheme: a scalar is shown under the name it was logged by, filed in a group that
says whose it is (`tensorboard_tag`). TensorBoard draws one chart per tag, a line per run, sorts
tag groups (a tag's part before its first `/`) by name and expands the first two; so:
- `<task>/`: what the task logged (`classifier/train/loss_step`, `classifier/val/acc`, ...),
  the group named after the task's class (`task_group`: Classifier -> classifier), so that each
  task's runs have charts of their own and a language model's loss never squashes a
  classifier's;
- `vitals/`: fasttrain's run-health scalars, shared by every task (`vitals/perf/*`,
  `vitals/grad_norm/total`, `vitals/lr`);
- `verdict/`: the run's results, the HPARAMS tab's metrics, in the session's run only
  (`verdict_tag`). TensorBoard lists a session's metrics by name, shows the first five and
  draws parallel coordinates only through the sessions that have all of them: so what every
  task has comes first (`verdict/loss/{test,val}`, `verdict/perf/*`), the task's own values
  after it (`verdict/task/<task>/val/acc_best`, ...), and a log folder of mixed tasks still
  draws. Test values are single points, so they are only there.
Other trackers (CSV, MLflow, W&B) keep the names as logged; so does the run's `metrics.json`.

One step convention for every scalar: x is the number of optimizer steps completed when the
value was measured (`trainer.global_step`). Values logged every N steps land on multiples of N:
the training loss, the learning rate and gradient norms at the start of steps 0, N, 2N, ...
(before that step's update), throughput over the N steps that end at N, 2N, ...; validation and
test values at the step where they were measured.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.parse
from collections.abc import Collection, Mapping, Sequence
from typing import Any, cast

import lightning as L
from lightning.pytorch.loggers import Logger, TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

Value = bool | int | float | str

# Custom Scalars: categories and charts in the order shown; each chart a list of tag regexes,
# `[^/]+/` standing for the task's group (one layout serves every task).
LAYOUT: dict[str, dict[str, list[Any]]] = {
    "training": {
        "loss: train vs val": [
            "Multiline",
            [r"^[^/]+/train/loss_step$", r"^[^/]+/train/loss_epoch$", r"^[^/]+/val/loss$"],
        ],
        "learning rate": ["Multiline", [r"^vitals/lr(/.*)?$"]],
        "gradient norm (total, before clipping)": ["Multiline", [r"^vitals/grad_norm/total$"]],
    },
    "speed": {
        "throughput (samples/s)": ["Multiline", [r"^vitals/perf/samples_per_sec$"]],
        "share of step time waiting for data": ["Multiline", [r"^vitals/perf/data_wait_share$"]],
        "step time (ms)": ["Multiline", [r"^vitals/perf/step_time_ms$"]],
        "CPU use (%)": ["Multiline", [r"^vitals/perf/cpu_util_pct$"]],
    },
}
# Logged on CUDA only (fasttrain.callbacks.perf): a chart of them on a CPU run would stay empty.
CUDA_LAYOUT: dict[str, list[Any]] = {
    "device memory (GB)": [
        "Multiline",
        [r"^vitals/perf/(mem_allocated_gb|mem_peak_gb|gpu_mem_used_gb)$"],
    ],
    "MFU and GPU use": ["Multiline", [r"^vitals/perf/mfu$", r"^vitals/perf/gpu_util_pct$"]],
}


def layout(
    cuda: bool, charts: Mapping[str, Sequence[str]] | None = None
) -> dict[str, dict[str, list[Any]]]:
    """The Custom Scalars layout of a run: the task's `charts` (title -> regexes over the names
    it logs) after the loss chart; the memory and MFU charts where they are logged."""
    loss, *rest = LAYOUT["training"].items()
    own = [(title, ["Multiline", [tensorboard_pattern(t) for t in tags]])
           for title, tags in (charts or {}).items()]  # fmt: skip
    chosen = {**LAYOUT, "training": dict([loss, *own, *rest])}
    if cuda:
        chosen["speed"] = {**LAYOUT["speed"], **CUDA_LAYOUT}
    return chosen


# The HPARAMS session's run, below the run folder: its events hold the session and `verdict/*`.
SESSION_RUN = "hparams"
# fasttrain's run-health scalars (fasttrain.callbacks.perf, grad_health; LearningRate).
VITALS = ("perf/", "grad_norm/", "grad_norm_layers/", "lr/")
# The group of a run whose task is not known (a logger used outside build_run).
DEFAULT_GROUP = "task"


def task_group(model: Any) -> str:
    """The TensorBoard group of a task's values: its class name in snake case (Classifier ->
    classifier, LanguageModel -> language_model, a user's MNISTLitModule -> mnist_lit_module)."""
    name = type(model).__name__
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def tensorboard_tag(name: str, group: str = DEFAULT_GROUP) -> str | None:
    """The TensorBoard tag of a logged scalar, in the run folder: the name as logged, in the
    task's `group` (val/acc -> classifier/val/acc), or in `vitals/` for run health (lr ->
    vitals/lr, perf/x -> vitals/perf/x); None: shown in the session's run only (test values
    and `final/*`)."""
    if name.startswith(("test/", "final/")):
        return None
    if name == "lr" or name.startswith(VITALS):
        return f"vitals/{name}"
    return f"{group}/{name}"


def tensorboard_pattern(pattern: str) -> str:
    """A chart's regex over logged names (`^val/mse(_best)?$`) as one over TensorBoard's tags
    (`^[^/]+/val/mse(_best)?$`: any group, the name as logged after it)."""
    return "^[^/]+/" + pattern.removeprefix("^")


def logged_name(tag: str) -> str:
    """The name a scalar was logged under, from its TensorBoard tag (the group dropped):
    classifier/val/acc -> val/acc, vitals/lr -> lr."""
    return tag.partition("/")[2] or tag


def read_scalars(run_dir: str | os.PathLike[str]) -> dict[str, list[tuple[int, float]]]:
    """A run's TensorBoard curves by the name logged -> (step, value) in step order; the
    results are in `<run>/hparams` (`verdict/*`)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.fspath(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {logged_name(t): [(e.step, e.value) for e in acc.Scalars(t)]
            for t in acc.Tags()["scalars"]}  # fmt: skip


def verdict_tag(name: str, group: str = DEFAULT_GROUP) -> str | None:
    """The session's metric a logged scalar is, or None: what every task has first, val/loss and
    test/loss (and their final/ values) -> verdict/loss/{val,test}, final/perf/x (the run's
    performance summary) -> verdict/perf/x; then the task's own: val/<m>, val/<m>_best, test/<m>
    -> verdict/task/<group>/<name> (a classifier's test/acc and a language model's token
    accuracy are two columns)."""
    final = name.startswith("final/")
    name = name.removeprefix("final/")
    if name in ("val/loss", "test/loss"):
        return "verdict/loss/" + name.partition("/")[0]
    if name.startswith(("val/", "test/")):
        return f"verdict/task/{group}/{name}"
    if final and name.startswith("perf/"):  # the run's summary, not every window's value
        return "verdict/" + name
    return None


class RunLogger(TensorBoardLogger):
    """TensorBoardLogger writing into `save_dir` itself (no name/version subfolders), without the
    `epoch` scalar Lightning adds to every logging call, with the Custom Scalars layout, and the
    tags named as the module's docstring says (the session's values in `save_dir/hparams`).

    Args:
        save_dir: the run folder.
        log_graph: also write the model's graph (Lightning's option).
        flush_secs: how often pending events are written to disk.
    """

    def __init__(self, save_dir: str, log_graph: bool = False, flush_secs: int = 120) -> None:
        # No `hp_metric` scalar of -1: the HPARAMS session is start_session's.
        super().__init__(save_dir, name="", version="", log_graph=log_graph,
                         default_hp_metric=False, flush_secs=flush_secs)  # fmt: skip
        # Set by whoever builds the run (fasttrain.assemble.build_run) before the first event
        # is written: the task's own charts (fasttrain.models.task `charts`), its monitored
        # metric and its group (`task_group`).
        self.task_charts: dict[str, list[str]] = {}
        self.monitor: str | None = None
        self.group = DEFAULT_GROUP
        self._session: Any = None  # the session run's SummaryWriter, on rank zero
        self._verdict_steps: dict[str, int] = {}  # tag -> the step last written

    @property
    def session_writer(self) -> Any:
        """The SummaryWriter of the HPARAMS session's run (`save_dir/hparams`)."""
        if self._session is None:
            from torch.utils.tensorboard import SummaryWriter

            self._session = SummaryWriter(os.path.join(self.save_dir, SESSION_RUN), **self._kwargs)
        return self._session

    @property
    def experiment(self) -> Any:
        fresh = self._experiment is None
        writer = super().experiment
        if fresh and self._experiment is not None:  # just created, on rank zero
            import torch

            writer.add_custom_scalars(layout(torch.cuda.is_available(), self.task_charts))
        return writer

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        curves: dict[str, Any] = {}
        results: dict[str, Any] = {}
        for name, value in metrics.items():
            tag = tensorboard_tag(name, self.group) if name != "epoch" else None
            if tag:
                curves[tag] = value
            result = verdict_tag(name, self.group)
            if result:
                results[result] = value
        if curves:
            super().log_metrics(curves, step)
        if results:
            self._log_verdict(results, step or 0)

    def _log_verdict(self, values: Mapping[str, Any], step: int) -> None:
        # Written as validation and test log them (a killed run is listed as far as it got),
        # then again by end_session's final values: each tag once per step.
        writer = self.session_writer
        for tag, value in values.items():
            if self._verdict_steps.get(tag) != step:
                writer.add_scalar(tag, float(value), step)
                self._verdict_steps[tag] = step
        writer.flush()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        super().finalize(status)
        if self._session is not None:
            self._session.close()
            self._session = None


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


def pinned_tags(
    monitor: str | None, logged: Collection[str], group: str = DEFAULT_GROUP
) -> list[str]:
    """The charts the printed `view` link pins, of the values the run logged: the monitored
    metric, the validation loss, then the training loss per step."""
    wanted = dict.fromkeys(name for name in (monitor, "val/loss", "train/loss_step") if name)
    return [f"{group}/{name}" for name in wanted if name in logged]


def view_url(tags: Sequence[str], port: int = 6006) -> str:
    """TensorBoard's Time Series page with `tags` pinned first (its `pinnedCards` link), curves
    unsmoothed (TensorBoard's default of 0.6 misreports a curve of a few validation points)."""
    cards = json.dumps([{"plugin": "scalars", "tag": t} for t in tags], separators=(",", ":"))
    return (
        f"http://127.0.0.1:{port}/?smoothing=0&pinnedCards={urllib.parse.quote(cards)}#timeseries"
    )


def trial_id(run_name: str) -> str:
    """The HPARAMS table's "Trial ID": the run folder's name without the date, so that what
    tells runs apart (the time to the second, then the overrides) shows at its default width:
    `2026-01-31_12-00-00_seed=1` -> `12-00-00_seed=1`; a sweep job's `3_seed=1` stays."""
    return re.sub(r"^\d{4}-\d{2}-\d{2}_", "", run_name)


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
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    for group in ("data", "model"):
        # By the option's name ("digits", "cnn"), given or not: parallel coordinates draw only
        # the sessions that have every column shown, so a default run has these columns too.
        if choices.get(group):
            extra[group] = choices[group]
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
