"""The summary of a k-fold sweep: `python train.py -m data.fold='range(5)'` ends with
`cv_summary.json` in the sweep folder and a printed table, each metric's mean and standard
deviation over the folds beside its per-fold values.

A Hydra callback (conf/hydra/default.yaml): Hydra calls it once, in the process that launched
the sweep, after the last job, whatever the launcher (local or SLURM). It reads what each job
left in its folder (`metrics.json`, `.hydra/overrides.yaml`), so it needs nothing from the jobs'
processes. Jobs that differ in more than the fold (`-m data.fold='range(5)' seed=1,2`) are
summarised per group of equal other overrides.

The hook only: Hydra builds it for every run, and the summary (fasttrain.tools.cv_summary) is
imported only at the end of a fold sweep.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

FOLD = "data.fold="


class CrossValidationSummary(Callback):
    """After a sweep over `data.fold`: cv_summary.json in the sweep folder and a table."""

    def on_job_end(self, config: Any, job_return: Any = None, **kwargs: Any) -> None:
        """cv_summary.json rewritten after every job of a fold sweep: Hydra skips
        on_multirun_end when a job failed (its sweeper re-raises the error after the last job),
        so a crashed or killed fold still leaves the summary of the folds that finished."""
        from hydra.core.utils import JobStatus
        from hydra.types import RunMode

        if config.hydra.mode != RunMode.MULTIRUN or not _is_fold_sweep(config):
            return  # a single run (or a rank's): no sweep folder to summarise
        from fasttrain.tools.cv_summary import write

        file = write(Path(str(config.hydra.sweep.dir)))
        if getattr(job_return, "status", None) == JobStatus.FAILED:
            print(f"cv_summary: job {config.hydra.job.num} failed; {file} holds the folds "
                  "that finished", file=sys.stderr)  # fmt: skip

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        if not _is_fold_sweep(config):
            return  # not a cross-validation sweep
        from fasttrain.tools.cv_summary import show, write

        file = write(Path(str(config.hydra.sweep.dir)))
        show(json.loads(file.read_text()), file)


def _is_fold_sweep(config: Any) -> bool:
    return any(str(o).lstrip("+").startswith(FOLD) for o in config.hydra.overrides.task)
