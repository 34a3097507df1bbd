"""`logger=mlflow`: MLflowRun, Lightning's MLFlowLogger for one fasttrain run (what it records:
fasttrain.callbacks.trackers). A SQLite tracking database under `logs/` by default; the run
folder keeps its MLflow run's id (RUN_ID_FILE), so a continued run goes on as the same MLflow
run; a server that does not answer is one line before the run starts."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shlex
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from fasttrain.callbacks import trackers
from fasttrain.config.errors import ConfigError
from fasttrain.config.project import shown
from fasttrain.config.settings import run_tags

log = logging.getLogger(__name__)

# The MLflow tag that names the run folder (for a reader of the store; the run is found again by
# RUN_ID_FILE: MLflow's filter parser does not unescape a quote, so a folder name holding ' or \
# never matched a search by the tag).
RUN_DIR_TAG = "fasttrain.run_dir"
# In the run folder: the id of its MLflow run, read back when the run is continued.
RUN_ID_FILE = ".mlflow-run-id"
# The experiment tag MLflow 3 keeps an experiment's kind in (the kind selector of its page), and
# the kind of a training run. The UI opens on the sidebar's GenAI / Model training switch, kept
# in the browser; `workflowType=machine_learning` in the address sets it (view_url).
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
WORKFLOW_QUERY = "workflowType=machine_learning"
# The Runs table as the printed link opens it: with no view it shows no metric column at all.
# MLflow keeps a shared view of the page in an experiment tag (`mlflow.sharedViewState.<key>`,
# what its own Share writes) and opens it from `viewStateShareKey=<key>` in the address; each
# run adds its task's columns (view_columns), first in the table, after the ones already there.
VIEW_KEY = "fasttrain"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
MAX_VIEW_COLUMNS = 24
# Artifacts of every run: the composed config and the overrides (Hydra's, beside the run), and
# the performance summary (fasttrain.callbacks.perf) once the run ends. Small text files only;
# checkpoints are uploaded only with log_model.
CONFIG_FILES = (".hydra/config.yaml", ".hydra/overrides.yaml")
CONFIG_ARTIFACTS = "config"
SUMMARY_FILES = ("perf_summary.json",)
CHECKPOINT_ARTIFACTS = "checkpoint"  # the best checkpoint's file, with log_model=true
# The run's Description on its page (MLflow's own tag), written by record_end
NOTE_TAG, NOTE_HEAD = "mlflow.note.content", "Final values (fasttrain):"
# The ids MLflow gives runs (uuid4 hex): what is read back from RUN_ID_FILE must be one.
_MLFLOW_RUN_ID = re.compile(r"[0-9a-f]{32}")
_MLFLOW_UNSAFE = re.compile(r"[^a-zA-Z0-9_/. -]+")


class MLflowRun(MLFlowLogger, trackers.Tracker):
    """Lightning's MLFlowLogger for one fasttrain run.

    Args:
        tracking_uri: where runs are recorded (default: a SQLite file under `logs/`).
        experiment_name: the MLflow experiment (default: the task, e.g. `train`).
        run_name: the MLflow run's name (default: the run folder's name).
        run_dir: the run folder, kept as a tag: the same folder continues the same MLflow run.
        tags: the run's `tags=`, each an MLflow tag (with an empty value).
        artifact_location: where a new experiment keeps artifacts (the config, the performance
            summary and, with log_model, checkpoints).
        log_model: also upload checkpoints: False (default) records the best checkpoint's
            path only (the `checkpoint` tag); True uploads the best checkpoint's file as well
            (artifact `checkpoint/`, at the end of the run); "all": every checkpoint as it is
            saved (Lightning's MLFlowLogger, one artifact folder per file).
    """

    def __init__(self, tracking_uri: str, experiment_name: str, run_name: str, run_dir: str,
                 tags: Sequence[str] | str = (), artifact_location: str | None = None,
                 log_model: bool | str = False) -> None:  # fmt: skip
        trackers.require("mlflow", "logger=mlflow")
        if log_model not in (True, False, "all"):
            raise ConfigError("log_model", log_model, "expected false (the best "
                              "checkpoint's path only), true (upload the best checkpoint) or "
                              "all (every checkpoint as it is saved)")  # fmt: skip
        _check_mlflow_server(tracking_uri)
        labels = {tag: "" for tag in run_tags(tags)} | {RUN_DIR_TAG: str(Path(run_dir).absolute())}
        with _one_at_a_time(tracking_uri):  # the client creates (migrates) a new database
            super().__init__(experiment_name=experiment_name, run_name=run_name,
                             tracking_uri=tracking_uri, tags=labels,
                             artifact_location=artifact_location,
                             log_model="all" if log_model == "all" else False)  # fmt: skip
        # Lightning's log_model=True uploads the checkpoints of the callback that saved last
        # (last.ckpt here, not the best): the best is uploaded in record_end instead.
        self._upload_best = log_model is True
        self._run_dir = labels[RUN_DIR_TAG]
        self.monitor: str | None = None  # the task's monitored metric, set by build_run

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._initialized:
            return super().experiment
        with _one_at_a_time(self._tracking_uri):  # two runs would both create the experiment
            if self._run_id is None:
                self._run_id = self._continued_run()
            client = super().experiment
            _keep_run_id(Path(self._run_dir) / RUN_ID_FILE, str(self._run_id))
            _mark_model_training(client, str(self._experiment_id))
            _add_view_columns(client, str(self._experiment_id), view_columns(self.monitor))
            return client

    def _continued_run(self) -> str | None:
        """The MLflow run this run folder recorded (RUN_ID_FILE), if it is still a run of this
        experiment in the store. The file is anyone's to edit: whatever else it holds starts a
        new MLflow run, said in one line."""
        path = Path(self._run_dir) / RUN_ID_FILE
        if not path.exists() and not path.is_symlink():
            return None
        kept = _read_run_id(path)
        if kept is not None and self._is_run_here(kept):
            return kept
        log.warning("%s names no run of MLflow experiment %r in %s: this run is a new MLflow run",
                    shown(path), self._experiment_name, self._tracking_uri)  # fmt: skip
        return None

    def _is_run_here(self, run_id: str) -> bool:
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        client = MlflowClient(self._tracking_uri)
        try:
            run = client.get_run(run_id)
        except MlflowException:  # not in the store
            return False
        found = client.get_experiment_by_name(self._experiment_name)
        return (found is not None and found.lifecycle_stage == "active"
                and run.info.experiment_id == found.experiment_id
                and run.info.lifecycle_stage == "active")  # fmt: skip

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Lightning's own call passes the module's constructor arguments (whole nets among
        them): the run's hyperparameters are `record_start`'s."""

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        # MLflow's metric names: letters, digits and _ / . - space; Lightning drops any other
        # character with a warning per name (per-layer gradient norms: "... (Linear)").
        named = {_MLFLOW_UNSAFE.sub("", k): v for k, v in trackers.without_epoch(metrics).items()}
        super().log_metrics(named, step)

    @rank_zero_only
    def record_start(self, hparams: Mapping[str, Any]) -> None:
        # Params are write-once in MLflow: a continued run logs only the ones it lacks.
        logged = self.experiment.get_run(self.run_id).data.params
        super().log_hyperparams({k: v for k, v in hparams.items() if k not in logged})
        self._log_files(CONFIG_FILES, CONFIG_ARTIFACTS)

    @rank_zero_only
    def record_end(self, final: Mapping[str, float], step: int, checkpoint: str | None) -> None:
        """The final val/ and test/ values are the latest values of those metrics already (the
        runs table's columns, the run page's table): no `final/*` copies. The performance
        summary is an artifact (perf_summary.json), the best checkpoint's path a tag."""
        self._log_files(SUMMARY_FILES, None)
        kept = self.experiment.get_run(self.run_id).data.tags.get(NOTE_TAG, "")
        if not kept or kept.startswith(NOTE_HEAD):  # a description written in the UI stays
            self.experiment.set_tag(self.run_id, NOTE_TAG, _note(final))
        if checkpoint:
            self.experiment.set_tag(self.run_id, "checkpoint", str(Path(checkpoint).absolute()))
            if self._upload_best:
                self.experiment.log_artifact(self.run_id, checkpoint, CHECKPOINT_ARTIFACTS)

    def _log_files(self, names: Sequence[str], artifact_path: str | None) -> None:
        for name in names:
            path = Path(self._run_dir) / name
            if path.is_file():
                self.experiment.log_artifact(self.run_id, str(path), artifact_path)

    def show_command(self) -> str:
        # One worker: MLflow's default four, each starting its app, were killed and restarted
        # in a loop on a loaded 2-core machine and the page never answered.
        store = shlex.quote(self._tracking_uri)
        return f"{trackers.executable('mlflow')} ui --backend-store-uri {store} {MLFLOW_UI_ARGS}"

    def shown_commands(self) -> dict[str, str]:
        return {"MLflow": self.show_command(), "MLflow view": self.view_url()}

    def view_url(self) -> str:
        """The experiment's runs in the page `show_command` serves, on Model training."""
        return (f"{MLFLOW_UI_URL}/#/experiments/{self._experiment_id}/runs?{WORKFLOW_QUERY}"
                f"&viewStateShareKey={VIEW_KEY}")  # fmt: skip


MLFLOW_UI_ARGS = "--host 127.0.0.1 --port 5000 --workers 1"
MLFLOW_UI_URL = "http://127.0.0.1:5000"


def _note(final: Mapping[str, float]) -> str:
    """The run page's Description, above its metrics: the final test and val values."""
    shown = sorted((k for k in final if k.startswith(("test/", "val/"))), key=lambda k: (k[0], k))
    rows = [f"| {k} | {float(final[k]):.4g} |" for k in shown]
    return "\n".join([NOTE_HEAD, "", "| metric | value |", "|---|---|", *rows])


def _mark_model_training(client: Any, experiment_id: str) -> None:
    """EXPERIMENT_KIND on an experiment that has no kind yet (one chosen in the UI stays)."""
    key, kind = EXPERIMENT_KIND
    if key not in client.get_experiment(experiment_id).tags:
        client.set_experiment_tag(experiment_id, key, kind)


def view_columns(monitor: str | None) -> list[str]:
    """The Runs table's columns for a task's runs: its monitored metric and that metric's best,
    the validation loss, their test twins (MLflow's column keys, metrics.`val/acc`)."""
    names = [monitor, f"{monitor}_best"] if monitor else []
    names.append("val/loss")
    if monitor and monitor.startswith("val/"):
        names.append("test/" + monitor.removeprefix("val/"))
    names.append("test/loss")
    return [f"metrics.`{name}`" for name in dict.fromkeys(names)]


def _add_view_columns(client: Any, experiment_id: str, columns: Sequence[str]) -> None:
    """VIEW_TAG's columns with `columns` added (another task's runs keep theirs); a tag that
    is not such a view is replaced."""
    try:
        kept = json.loads(client.get_experiment(experiment_id).tags.get(VIEW_TAG, "{}"))
    except ValueError:
        kept = None
    listed = kept.get("selectedColumns") if isinstance(kept, dict) else None
    shown = [c for c in listed if isinstance(c, str)] if isinstance(listed, list) else []
    merged = list(dict.fromkeys([*shown, *columns]))[:MAX_VIEW_COLUMNS]
    if merged != shown:
        view = {"selectedColumns": merged, "columnOrder": merged}
        client.set_experiment_tag(experiment_id, VIEW_TAG, json.dumps(view))


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


def _read_run_id(path: Path) -> str | None:
    """The run id in `path`, or None unless it is one of MLflow's. Only a regular file is read,
    and only its first bytes: a FIFO would block, a symlink to a device never end."""
    if not path.is_file():
        return None
    try:
        with path.open("rb") as handle:
            text = handle.read(64).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _MLFLOW_RUN_ID.fullmatch(text) else None


def _keep_run_id(path: Path, run_id: str) -> None:
    """RUN_ID_FILE, replaced whole: a run stopped while writing leaves the old id or the new."""
    if _read_run_id(path) == run_id:
        return
    part = path.with_name(path.name + ".part")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        part.write_text(run_id + "\n")
        os.replace(part, path)  # replaces a symlink itself, never the file it points to
    except OSError as err:  # a folder in its place, say: the run goes on, not found again
        part.unlink(missing_ok=True)
        log.warning("%s: the MLflow run id cannot be kept (%s): continuing this run folder will "
                    "start a new MLflow run", shown(path), err.strerror or err)  # fmt: skip


def _check_mlflow_server(tracking_uri: str) -> None:
    """One request to an MLflow server, with the client's retries off and its timeout REACH_S
    (MLflow's own knobs, for this request only): one that does not answer is refused now, not
    after minutes of retries. The run's own requests keep the defaults (a blip mid-run is
    retried)."""
    if not tracking_uri.startswith(("http://", "https://")):
        return
    from mlflow.environment_variables import (
        MLFLOW_HTTP_REQUEST_MAX_RETRIES,
        MLFLOW_HTTP_REQUEST_TIMEOUT,
    )
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    bounded = {MLFLOW_HTTP_REQUEST_MAX_RETRIES.name: "0",
               MLFLOW_HTTP_REQUEST_TIMEOUT.name: str(trackers.REACH_S)}  # fmt: skip
    try:
        with _environ(bounded):
            MlflowClient(tracking_uri).search_experiments(max_results=1)
    except MlflowException as err:
        raise ConfigError("tracking_uri", tracking_uri, _mlflow_refusal(err)) from None


def _mlflow_refusal(err: Exception) -> str:
    import requests

    # MLflow raises its exception inside the handler of the transport's: a connection refused or
    # timed out is that context; an error status is the server's answer.
    if isinstance(err.__context__, requests.RequestException):
        return (f"no MLflow server answered within {trackers.REACH_S} s; start one (mlflow "
                "server), or drop the override for the SQLite store under logs/")  # fmt: skip
    return f"the server answered, but not as MLflow expects: {trackers.first_line(err)}"


@contextlib.contextmanager
def _environ(values: Mapping[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
