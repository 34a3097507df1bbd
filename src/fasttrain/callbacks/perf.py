"""PerfMonitor: throughput, data-loading wait, memory, utilisation and MFU under `perf/`.

Cheap by construction: per training step it reads the clock a few times and adds floats. The
device is synchronised only on logging steps, so a window's time is real device time while single
steps stay asynchronous. A window ends with the optimizer step that completes a multiple of
`trainer.log_every_n_steps` steps and is logged at that x (N, 2N, ...: optimizer steps completed,
the convention of every scalar, see fasttrain.callbacks.board). At the end of fit the run's
figures go to perf_summary.json, and `summary` keeps them for the HPARAMS tab.

Not Lightning's ThroughputMonitor: its `_update` calls torch.cuda.synchronize() after every
training batch, a device sync on each quiet step (the hot path allows one per logging step), and
it has no data-wait share, step-time median or memory figures; its FLOP counter is what
fasttrain.callbacks.flops uses.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import time
from array import array
from pathlib import Path
from typing import Annotated, Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.exceptions import MisconfigurationException

from fasttrain.callbacks.flops import (
    dense_peak_tflops,
    flops_per_sample,
    formula_flops,
    matmul_dtype,
    tokens_per_sample,
)
from fasttrain.config.domains import Positive, check_arguments

GB = 1e9


class _Window:
    """Sums over the steps since the last logging step (and, separately, over the whole fit)."""

    __slots__ = ("samples", "steps", "time", "wait")

    def __init__(self) -> None:
        self.steps, self.samples, self.time, self.wait = 0, 0, 0.0, 0.0

    def add(self, other: _Window) -> None:
        self.steps += other.steps
        self.samples += other.samples
        self.time += other.time
        self.wait += other.wait


class PerfMonitor(L.Callback):
    """Logs perf/samples_per_sec, perf/step_time_ms, perf/data_wait_share, perf/cpu_util_pct and,
    on CUDA, perf/mem_allocated_gb, perf/mem_peak_gb, perf/gpu_util_pct, perf/gpu_mem_used_gb
    (the last two need nvidia-ml-py: `pip install fasttrain[gpu]`), plus perf/mfu when the
    device's dense peak is known: a table and `<output_dir>/perf_summary.json`.

    Args:
        output_dir: where perf_summary.json goes (the run dir); None: trainer.default_root_dir.
        peak_tflops: the device's peak TFLOP/s for the run's matmul dtype, overriding the
            built-in table (and enabling perf/mfu on devices it lacks, CPUs included).
    """

    def __init__(
        self, output_dir: str | None = None, peak_tflops: Annotated[float, Positive] | None = None
    ) -> None:
        super().__init__()
        check_arguments(PerfMonitor.__init__, locals())
        self.output_dir, self.peak_tflops = output_dir, peak_tflops
        self.summary: dict[str, Any] = {}

    # ---- set-up -----------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._device = pl_module.device
        self._cuda = self._device.type == "cuda"
        if self._cuda:  # this run's peak: not one left by earlier work in the process (a sweep)
            torch.cuda.reset_peak_memory_stats(self._device)
        self._world = trainer.world_size
        # Set on the trainer at run time by Lightning's logger connector, hence unknown to mypy.
        self._every = max(1, trainer.log_every_n_steps)  # type: ignore[attr-defined]
        self._window, self._total = _Window(), _Window()
        self._step_times = array("d")  # 8 bytes a step; median/p90 at the end
        self._mark: float | None = None  # when the current step began
        self._wait = 0.0  # time in the loader's `next` since the last step ended
        self._fetch_t0 = 0.0
        self._step_at_start = trainer.global_step  # of the batch under way
        self._gpu_util: list[float] = []
        self._cpu_mark = (_cpu_seconds(), time.perf_counter())
        self._device_name = (
            torch.cuda.get_device_name(self._device) if self._cuda else "cpu"
        )  # fmt: skip
        self._dtype = matmul_dtype(trainer.precision)
        self._peak = self.peak_tflops or (
            dense_peak_tflops(self._device_name, self._dtype) if self._cuda else None
        )
        self._flops_per_sample: float | None = None
        # Tokens per sample for a model of token sequences (a net with `flops_per_token`).
        self._tokens_per_sample: int | None = None
        self._measure_flops = self._peak is not None
        if self._cuda and self._peak is None:
            rank_zero_info(
                f"perf/mfu skipped: no dense {self._dtype} peak known for "
                f"'{self._device_name}'; set callbacks.perf.peak_tflops=<TFLOP/s>"
            )
        self._nvml = self._cuda and _nvml_available()
        self._timing_fetch = self._wrap_fetch(trainer)

    def _wrap_fetch(self, trainer: L.Trainer) -> bool:
        """Time the loader's `next` exactly where Lightning times `train_dataloader_next`.

        The training epoch loop hands `_on_before_fetch`/`_on_after_fetch` to its data fetcher at
        the start of every epoch (they drive the profiler). Wrapping them on the loop instance
        measures the very call that waits for the batch and nothing else: not validation, not
        checkpointing, not the host-to-device copy, and it works whatever profiler is set. The
        gap between two batch hooks would include all of those. Lightning's public profiler API
        cannot be used for this, since a trainer holds one profiler and the user may choose it.
        """
        # Private hooks (no public API times the fetch alone); if Lightning drops them the share
        # is skipped with a message, and tests/test_architecture.py fails.
        loop = trainer.fit_loop.epoch_loop
        before = getattr(loop, "_on_before_fetch", None)
        after = getattr(loop, "_on_after_fetch", None)
        if before is None or after is None:
            rank_zero_info("perf/data_wait_share skipped: this Lightning has no fetch hooks")
            return False

        def timed_before() -> None:
            before()
            self._fetch_t0 = time.perf_counter()
            if self._mark is None:  # first step of an epoch, or after validation
                self._mark = self._fetch_t0

        def timed_after() -> None:
            self._wait += time.perf_counter() - self._fetch_t0
            after()

        loop._on_before_fetch = timed_before  # type: ignore[method-assign]
        loop._on_after_fetch = timed_after  # type: ignore[method-assign]
        self._loop = loop
        return True

    # ---- per step ---------------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Epoch boundaries (worker start-up, loader re-creation) belong to no step.
        self._mark, self._wait = None, 0.0

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._mark = None  # validation inside an epoch belongs to no training step

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_at_start = trainer.global_step
        if self._mark is None:  # no fetch hook ran (e.g. the loader is consumed in the step)
            self._mark = time.perf_counter()
        if self._tokens_per_sample is None:
            self._tokens_per_sample = tokens_per_sample(pl_module, batch)
        if self._measure_flops:
            self._measure_flops = False
            start = time.perf_counter()
            try:
                self._flops_per_sample = formula_flops(pl_module, batch) or flops_per_sample(
                    pl_module, batch
                )
            except Exception as err:  # any forward signature; MFU is a bonus, never a failure
                rank_zero_info(f"perf/mfu skipped: FLOPs could not be counted ({err})")
            self._mark += time.perf_counter() - start  # counting is not training time

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        # This batch completed an optimizer step (the last micro-batch of an accumulation
        # window) and with it a multiple of N steps: the window ends here.
        step = trainer.global_step
        log_now = step != self._step_at_start and step % self._every == 0
        if log_now and self._cuda:
            # The only sync: the window's time then covers the device work it queued.
            torch.cuda.synchronize(self._device)
        now = time.perf_counter()
        # A step runs from the end of the previous one (or its fetch, after a boundary) to now:
        # on GPU a single step is host time, but every window of steps ends on a sync.
        dt = now - (self._mark if self._mark is not None else now)
        self._mark = now
        self._step_times.append(dt)
        w = self._window
        w.steps += 1
        w.time += dt
        w.wait += self._wait
        w.samples += _batch_size(batch)
        self._wait = 0.0
        if log_now:
            self._log_window(trainer)

    def _log_window(self, trainer: L.Trainer) -> None:
        w = self._window
        metrics = self._rates(w)
        cpu, wall = _cpu_seconds(), time.perf_counter()
        metrics["perf/cpu_util_pct"] = (
            100.0 * (cpu - self._cpu_mark[0]) / (wall - self._cpu_mark[1])
        )
        self._cpu_mark = (cpu, wall)
        if self._cuda:
            metrics["perf/mem_allocated_gb"] = torch.cuda.memory_allocated(self._device) / GB
            metrics["perf/mem_peak_gb"] = torch.cuda.max_memory_allocated(self._device) / GB
            if self._nvml:
                metrics.update(self._nvml_metrics())
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        self._total.add(w)
        self._window = _Window()

    def _rates(self, w: _Window) -> dict[str, float]:
        if w.steps == 0 or w.time <= 0:
            return {}
        # samples/s counts every process (equal batches per rank); the rest is this device's.
        rates = {
            "perf/samples_per_sec": w.samples * self._world / w.time,
            "perf/step_time_ms": 1e3 * w.time / w.steps,
        }
        if self._tokens_per_sample:
            rates["perf/tokens_per_sec"] = rates["perf/samples_per_sec"] * self._tokens_per_sample
        if self._timing_fetch:
            rates["perf/data_wait_share"] = min(1.0, w.wait / w.time)
        if self._flops_per_sample and self._peak:
            rates["perf/mfu"] = self._flops_per_sample * w.samples / w.time / (self._peak * 1e12)
        return rates

    def _nvml_metrics(self) -> dict[str, float]:
        # torch maps the CUDA device to its NVML index (CUDA_VISIBLE_DEVICES included).
        try:
            util = float(torch.cuda.utilization(self._device))
            used = torch.cuda.device_memory_used(self._device) / GB
        except Exception as err:  # e.g. a container without NVML access
            rank_zero_info(f"perf/gpu_* skipped from now on: NVML failed ({err})")
            self._nvml = False
            return {}
        self._gpu_util.append(util)
        return {"perf/gpu_util_pct": util, "perf/gpu_mem_used_gb": used}

    # ---- end of fit -------------------------------------------------------------------------
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The last partial window joins the totals unsynced: validation and the loss readout
        # have synchronised the device since, so its time is at most a few steps early.
        self._total.add(self._window)
        self._window = _Window()
        if hasattr(self, "_loop"):
            del self._loop._on_before_fetch, self._loop._on_after_fetch  # back to the methods
            del self._loop
        self.summary = self._summarize()
        self._report(Path(self.output_dir or trainer.default_root_dir))

    def _summarize(self) -> dict[str, Any]:
        t = self._total
        times = list(self._step_times)
        rates = self._rates(t)
        summary: dict[str, Any] = {
            "device": self._device_name,
            "matmul_dtype": self._dtype,
            "steps": t.steps,
            "train_time_s": t.time,
            "step_time_ms_median": 1e3 * statistics.median(times) if times else None,
            "step_time_ms_p90": 1e3 * _p90(times) if times else None,
            "samples_per_sec": rates.get("perf/samples_per_sec"),
            "tokens_per_sec": rates.get("perf/tokens_per_sec"),
            "data_wait_share": rates.get("perf/data_wait_share"),
            "mem_peak_gb": torch.cuda.max_memory_allocated(self._device) / GB
            if self._cuda
            else None,
            # ru_maxrss is in KiB on Linux: the training process's peak resident memory.
            "host_peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB,
            "gpu_util_pct_mean": statistics.fmean(self._gpu_util) if self._gpu_util else None,
            "flops_per_sample": self._flops_per_sample,
            "peak_tflops": self._peak,
            "mfu": rates.get("perf/mfu"),
        }
        return summary

    @rank_zero_only
    def _report(self, out_dir: Path) -> None:
        from rich.console import Console
        from rich.table import Table

        s = self.summary
        table = Table(title=f"performance ({s['steps']} steps on {s['device']})",
                      title_justify="left")  # fmt: skip
        table.add_column("measure")
        table.add_column("value", justify="right")
        rows = (
            ("step time median", s["step_time_ms_median"], "{:.2f} ms"),
            ("step time p90", s["step_time_ms_p90"], "{:.2f} ms"),
            ("samples/s", s["samples_per_sec"], "{:,.0f}"),
            ("tokens/s", s["tokens_per_sec"], "{:,.0f}"),
            ("data-wait share", s["data_wait_share"], "{:.1%}"),
            ("peak device memory", s["mem_peak_gb"], "{:.2f} GB"),
            ("peak host memory", s["host_peak_rss_gb"], "{:.2f} GB"),
            ("GPU utilisation", s["gpu_util_pct_mean"], "{:.0f} %"),
            ("MFU", s["mfu"], "{:.1%}"),
        )
        for name, value, fmt in rows:
            if value is not None:
                table.add_row(name, fmt.format(value))
        Console(soft_wrap=True).print(table)
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "perf_summary.json").write_text(json.dumps(s, indent=2))


def _batch_size(batch: Any) -> int:
    # The common case first, (x, y, ...) tensors: extract_batch_size walks the whole batch.
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else None
    if isinstance(first, torch.Tensor) and first.ndim:
        return int(first.shape[0])
    try:
        return extract_batch_size(batch)
    except MisconfigurationException:  # no tensor in the batch: samples/s counts batches
        return 1


def _p90(values: list[float]) -> float:
    # "inclusive": interpolates between the measured values, so p90 >= median for any count.
    return (
        statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]
    )


def _cpu_seconds() -> float:
    """CPU time of this process (all its threads); loader workers are processes of their own."""
    t = os.times()
    return t.user + t.system


def _nvml_available() -> bool:
    try:
        import pynvml  # noqa: F401  (nvidia-ml-py; torch.cuda.utilization needs it)
    except ImportError:
        rank_zero_info(
            "perf/gpu_util_pct and perf/gpu_mem_used_gb skipped: nvidia-ml-py is not installed "
            "(pip install 'fasttrain[gpu]')"
        )
        return False
    return True
