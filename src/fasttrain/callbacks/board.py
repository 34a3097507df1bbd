"""What TensorBoard shows of a run, arranged so that it answers the usual questions at a glance.

- `RunLogger`: Lightning's TensorBoardLogger writing its events into the run folder itself, so
  TensorBoard lists the run as `<entry>/<run_name>` (`train/lr=0.01,seed=1_0131-120005`), its
  training and validation curves in that one run (one colour per run); without Lightning's
  `epoch` scalar (the Time Series page would open on its staircase); with a Custom Scalars
  layout (`LAYOUT`: train vs val loss and the task's own charts, throughput, data wait, memory,
  learning rate, total gradient norm).
- `LearningRate`: the learning rate, the one place it is logged.
- `pinned_tags` / `view_url`: the link a run prints, its loss and monitored metric pinned.
The run's HPARAMS session (its own run, `<run>/hparams`) is fasttrain.callbacks.sessions'.

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
import urllib.parse
from collections.abc import Collection, Mapping, Sequence
from typing import Annotated, Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from fasttrain.config.domains import AtLeast, check_arguments

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
# TensorBoard's colour groups (`runColorGroup`): a run and its session's run in one colour.
# fasttrain.tools.board's landing sets the same (it cannot import this module's Lightning).
COLOUR_BY_RUN = f"regex:^(.+?)(?:/{SESSION_RUN})?$"
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

    def __init__(
        self, save_dir: str, log_graph: bool = False, flush_secs: Annotated[int, AtLeast(1)] = 120
    ) -> None:
        check_arguments(RunLogger.__init__, locals())
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
        # Lightning finalizes after fit and again after test: the session's writer stays open
        # until the session ends (close_session), one event file for the run. Reopened per
        # stage it wrote three, named by a per-process counter that TensorBoard sorts as text:
        # written in one second at counts 9, 10, 11 (a sweep's short jobs, one process), it
        # reads 10 and 11 first, takes 9's earlier steps for a restart and drops the results.
        super().finalize(status)
        if self._session is not None:
            self._session.flush()

    def close_session(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


class LearningRate(L.Callback):
    """Logs `lr` (with several parameter groups `lr/0`, `lr/1`, ...) at the start of every
    `trainer.log_every_n_steps`-th optimizer step: the rate that step's update uses. A host
    float read from the optimizer: no device sync.

    Not Lightning's LearningRateMonitor: it logs at x = N-1, 2N-1, ... (its check counts the
    step about to run, its x the steps done), off the one step convention every other scalar
    keeps, and names by the optimizer's class (`lr-AdamW`, `lr-AdamW/pg1`), which changes with
    model/optimizer= and would split one chart across runs."""

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


def pinned_tags(
    monitor: str | None, logged: Collection[str], group: str = DEFAULT_GROUP
) -> list[str]:
    """The charts the printed `view` link pins, of the values the run logged: the monitored
    metric, the validation loss, then the training loss per step."""
    wanted = dict.fromkeys(name for name in (monitor, "val/loss", "train/loss_step") if name)
    return [f"{group}/{name}" for name in wanted if name in logged]


def view_url(tags: Sequence[str], port: int = 6006) -> str:
    """TensorBoard's Time Series page with `tags` pinned first (its `pinnedCards` link), curves
    unsmoothed (TensorBoard's default of 0.6 misreports a curve of a few validation points),
    one colour a run (its `verdict/` points in `<run>/hparams` too)."""
    cards = json.dumps([{"plugin": "scalars", "tag": t} for t in tags], separators=(",", ":"))
    query = urllib.parse.urlencode(
        {"smoothing": 0, "runColorGroup": COLOUR_BY_RUN, "pinnedCards": cards}
    )
    return f"http://127.0.0.1:{port}/?{query}#timeseries"
