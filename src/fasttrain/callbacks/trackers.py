"""MLflow and Weights & Biases, one override each (`logger=mlflow`, `logger=wandb`; several at
once: `logger=many`, or `logger=[tensorboard,mlflow]`), recording what TensorBoard's HPARAMS
session records (fasttrain.callbacks.board): the run's chosen hyperparameters (not the whole
config), its `tags=`, the final val/test and performance values as `final/*` at the last step,
and the path of the best checkpoint. Every scalar keeps the one step convention of
fasttrain.callbacks.board (x = optimizer steps completed), without Lightning's `epoch` scalar.

Both stay on this machine by default: MLflow writes a SQLite tracking database under `logs/`
(`mlflow ui --backend-store-uri ...` shows it, the command printed at the end of a run); W&B runs
offline into the run folder (`wandb sync <folder>` uploads it later, also printed). A run
continued in its folder (resume=auto) continues the same MLflow run and W&B run id.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import re
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import Logger, MLFlowLogger, WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from fasttrain.config.errors import UserError
from fasttrain.config.settings import run_tags

# The MLflow tag that names the run folder: a continued run (resume=auto) finds its MLflow run.
RUN_DIR_TAG = "fasttrain.run_dir"
_MLFLOW_UNSAFE = re.compile(r"[^a-zA-Z0-9_/. -]+")


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _require(module: str, override: str) -> None:
    """One line naming the extra to install, instead of Lightning's ModuleNotFoundError."""
    if not installed(module):
        raise UserError(f"{override} needs the {module} package: pip install -e '.[{module}]' "
                        f"(make install includes it), or choose another logger")  # fmt: skip


def _without_epoch(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if k != "epoch"}


def _executable(name: str) -> str:
    """The tool of this very environment (a bare name is found only with the venv activated)."""
    exe = Path(sys.executable).parent / name
    try:
        return str(exe.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


class MLflowRun(MLFlowLogger):
    """Lightning's MLFlowLogger for one fasttrain run.

    Args:
        tracking_uri: where runs are recorded (default: a SQLite file under `logs/`).
        experiment_name: the MLflow experiment (default: the task, e.g. `train`).
        run_name: the MLflow run's name (default: the run folder's name).
        run_dir: the run folder, kept as a tag: the same folder continues the same MLflow run.
        tags: the run's `tags=`, each an MLflow tag (with an empty value).
        artifact_location: where a new experiment keeps artifacts (none are logged by default).
    """

    def __init__(self, tracking_uri: str, experiment_name: str, run_name: str, run_dir: str,
                 tags: Sequence[str] | str = (),
                 artifact_location: str | None = None) -> None:  # fmt: skip
        _require("mlflow", "logger=mlflow")
        labels = {tag: "" for tag in run_tags(tags)} | {RUN_DIR_TAG: str(Path(run_dir).absolute())}
        with _one_at_a_time(tracking_uri):  # the client creates (migrates) a new database
            super().__init__(experiment_name=experiment_name, run_name=run_name,
                             tracking_uri=tracking_uri, tags=labels,
                             artifact_location=artifact_location)  # fmt: skip
        self._run_dir = labels[RUN_DIR_TAG]

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._initialized:
            return super().experiment
        with _one_at_a_time(self._tracking_uri):  # two runs would both create the experiment
            if self._run_id is None:
                self._run_id = self._continued_run()
            return super().experiment

    def _continued_run(self) -> str | None:
        """The id of the MLflow run recorded for this run folder before, if any."""
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self._tracking_uri)
        found = client.get_experiment_by_name(self._experiment_name)
        if found is None:
            return None
        same_folder = f"tags.`{RUN_DIR_TAG}` = '{_quoted(self._run_dir)}'"
        runs = client.search_runs([found.experiment_id], same_folder, max_results=1)
        return runs[0].info.run_id if runs else None

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Lightning's own call passes the module's constructor arguments (whole nets among
        them): the run's hyperparameters are `record_start`'s."""

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        # MLflow's metric names: letters, digits and _ / . - space; Lightning drops any other
        # character with a warning per name (per-layer gradient norms: "... (Linear)").
        named = {_MLFLOW_UNSAFE.sub("", k): v for k, v in _without_epoch(metrics).items()}
        super().log_metrics(named, step)

    @rank_zero_only
    def record_start(self, hparams: Mapping[str, Any]) -> None:
        # Params are write-once in MLflow: a continued run logs only the ones it lacks.
        logged = self.experiment.get_run(self.run_id).data.params
        super().log_hyperparams({k: v for k, v in hparams.items() if k not in logged})

    @rank_zero_only
    def record_end(self, final: Mapping[str, float], step: int, checkpoint: str | None) -> None:
        self.log_metrics({f"final/{k}": float(v) for k, v in final.items()}, step)
        if checkpoint:
            self.experiment.set_tag(self.run_id, "checkpoint", str(Path(checkpoint).absolute()))

    def show_command(self) -> str:
        return f"{_executable('mlflow')} ui --backend-store-uri {shlex.quote(self._tracking_uri)}"


@contextlib.contextmanager
def _one_at_a_time(tracking_uri: str | None) -> Iterator[None]:
    """Hold a lock beside a SQLite tracking database: two runs started at once would both create
    its tables (the second fails: "duplicate column name") or the same experiment."""
    path = tracking_uri.removeprefix("sqlite:///") if tracking_uri else ""
    if not (tracking_uri or "").startswith("sqlite:///") or sys.platform == "win32":
        yield
        return
    import fcntl

    lock = Path(path + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _quoted(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


class WandbRun(WandbLogger):
    """Lightning's WandbLogger for one fasttrain run, offline unless told otherwise.

    Args:
        save_dir: the run folder; W&B writes its `wandb/` folder there.
        project: the W&B project (the package's name; the task is the run's group).
        name: the W&B run's name (default: the run folder's name).
        tags: the run's `tags=`.
        offline: record locally only, no account or network needed (`wandb sync` uploads it).
        kwargs: passed on to `wandb.init` (entity, group, notes, ...).
    """

    def __init__(self, save_dir: str, project: str, name: str, tags: Sequence[str] | str = (),
                 offline: bool = True, **kwargs: Any) -> None:  # fmt: skip
        _require("wandb", "logger=wandb")
        # One id per run folder: a continued run (resume=auto) goes on as the same W&B run.
        run_id = hashlib.sha1(str(Path(save_dir).absolute()).encode()).hexdigest()[:16]
        kwargs = {"id": run_id, "resume": "allow", **kwargs}
        super().__init__(name=name, save_dir=save_dir, project=project, offline=offline,
                         tags=run_tags(tags), **kwargs)  # fmt: skip
        self._command = ""
        import wandb

        # Lightning's logger would go on writing into a run still open in this process (the
        # previous job of a sweep, one that failed before its end): not this run's.
        if wandb.run is not None and wandb.run.id != run_id:
            wandb.finish()

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Lightning's own call (the module's constructor arguments): see `record_start`."""

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        super().log_metrics(_without_epoch(metrics), step)

    @rank_zero_only
    def record_start(self, hparams: Mapping[str, Any]) -> None:
        self.experiment.config.update(dict(hparams), allow_val_change=True)

    @rank_zero_only
    def record_end(self, final: Mapping[str, float], step: int, checkpoint: str | None) -> None:
        """The last record of the run; the run is then finished (written out whole, and not
        reused by a later run in this process)."""
        self.log_metrics({f"final/{k}": float(v) for k, v in final.items()}, step)
        run = self.experiment
        if checkpoint:
            run.summary["checkpoint"] = str(Path(checkpoint).absolute())
        if self._offline:
            self._command = f"{_executable('wandb')} sync {shlex.quote(str(Path(run.dir).parent))}"
        else:
            self._command = str(getattr(run, "url", "") or "")
        run.finish()

    def show_command(self) -> str:
        """What uploads (offline) or shows (online) the run, once `record_end` has run."""
        return self._command


def record_start(loggers: Sequence[Logger], hparams: Mapping[str, Any]) -> None:
    for logger in loggers:
        if isinstance(logger, (MLflowRun, WandbRun)):
            logger.record_start(hparams)


def record_end(loggers: Sequence[Logger], final: Mapping[str, float], step: int,
               checkpoint: str | None) -> None:  # fmt: skip
    for logger in loggers:
        if isinstance(logger, (MLflowRun, WandbRun)):
            logger.record_end(final, step, checkpoint)


def commands(loggers: Sequence[Logger]) -> dict[str, str]:
    """What opens each tracker's record of the run, by tracker."""
    shown: dict[str, str] = {}
    for logger in loggers:
        if isinstance(logger, MLflowRun):
            shown["MLflow"] = logger.show_command()
        elif isinstance(logger, WandbRun) and logger.show_command():
            shown["W&B"] = logger.show_command()
    return shown
