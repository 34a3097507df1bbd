"""logger=mlflow and logger=wandb (fasttrain.callbacks.trackers) when the tracker is not there:
a server that does not answer, W&B online without an API key, and the run folder's record of
its MLflow run (RUN_ID_FILE) as a continued run reads it back. Nothing here reaches the
network: servers are 127.0.0.1 ports, closed, silent or answering with a local stub."""

from __future__ import annotations

import http.server
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, run_cli

pytest.importorskip("mlflow")
pytest.importorskip("wandb")

QUICK = ["model=mlp", "trainer.max_epochs=1", "data.num_workers=0", "callbacks.progress_bar=null"]
ID_FILE = ".mlflow-run-id"  # mlflow_run.RUN_ID_FILE, by name: what a user finds in a run folder
BOUND_S = 45  # a refusal: the probe's 10 s and the start-up of a 2-core machine under load


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that takes connections and never answers (the kernel's backlog accepts them)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


class NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    do_POST = do_GET

    def log_message(self, *args: Any) -> None:  # quiet: pytest shows stderr of a failure
        pass


@pytest.fixture
def answering_url() -> Iterator[str]:
    """A local HTTP server that answers every request, with 404: something is there."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def offline_home(root: Path, base_url: str, **env: str) -> dict[str, str]:
    """W&B's environment, all of it under `root`: the user's own settings and keys untouched."""
    names = ("HOME", "WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR")
    dirs = {name: str(root / name.lower()) for name in names}
    return {**dirs, "WANDB_BASE_URL": base_url, "WANDB_MODE": "online", "WANDB_SILENT": "true",
            "NETRC": str(root / "netrc"), **env}  # fmt: skip


def files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if not p.is_dir()) if folder.exists() else []


def refused(proc: Any, took: float, override: str) -> str:
    """The one `error:` line of a run refused before training, within BOUND_S."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert took < BOUND_S, f"{took:.0f} s"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {override}"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return errors[0]


# ---- a tracker that is not there: one line, before the run, nothing left ----------------------
@pytest.mark.slow  # a process to its refusal, ~15 s on 2 cores; in-process tests cover the rest
def test_an_unreachable_mlflow_server_is_one_line_before_the_run(tmp_path: Path) -> None:
    # Was: MLflow's client retried (7 times, with backoff) for minutes, then a traceback.
    uri = f"http://127.0.0.1:{closed_port()}"
    logs, work = tmp_path / "logs", tmp_path / "work"
    work.mkdir()
    start = time.monotonic()
    proc = run_cli([str(REPO / "train.py"), "logger=mlflow", f"logger.mlflow.tracking_uri={uri}",
                    *QUICK, "run_name=U"], logs, timeout=60, cwd=work)  # fmt: skip
    line = refused(proc, time.monotonic() - start, "logger.mlflow.tracking_uri=")
    assert uri in line and "no MLflow server answered within 10 s" in line
    assert files_in(logs) == [] and files_in(work) == []  # no run folder, no store, no mlruns/


@pytest.mark.slow  # a process to its refusal, ~15 s on 2 cores; in-process tests cover the rest
def test_wandb_online_without_a_server_is_one_line_before_the_run(tmp_path: Path) -> None:
    # Was: with an API key, wandb.init retried the server for two minutes, then a traceback
    # and a half-made wandb/ folder in the run folder.
    base = f"http://127.0.0.1:{closed_port()}"
    logs = tmp_path / "logs"
    env = offline_home(tmp_path / "home", base, WANDB_API_KEY="f" * 40)
    start = time.monotonic()
    proc = run_cli(["train.py", "logger=wandb", "logger.wandb.offline=false", *QUICK,
                    "run_name=W"], logs, timeout=60, **env)  # fmt: skip
    line = refused(proc, time.monotonic() - start, "logger.wandb.offline=false: ")
    assert f"no W&B server answered at {base} within 10 s" in line
    assert "WANDB_API_KEY" in line and "wandb sync" in line
    assert files_in(logs) == []


def test_an_mlflow_server_that_never_answers_is_refused_within_the_bound(
    silent_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow.tracking  # noqa: F401  (imported before the clock starts: seconds)

    from fasttrain.callbacks import mlflow_run, trackers
    from fasttrain.config.errors import ConfigError

    monkeypatch.setattr(trackers, "REACH_S", 1, raising=False)  # absent: no probe
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "5")  # the user's, for the run itself
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"^tracking_uri='http://.*no MLflow server answered "
                                          r"within 1 s; start one"):  # fmt: skip
        mlflow_run.MLflowRun(f"http://127.0.0.1:{silent_port}", "train", "T", "run")
    assert time.monotonic() - start < 5
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "5"  # only the probe had none
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT" not in os.environ


def test_a_server_that_is_no_mlflow_server_is_one_line(answering_url: str) -> None:
    from fasttrain.callbacks import mlflow_run
    from fasttrain.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"the server answered, but not as MLflow expects: .*404"):
        mlflow_run.MLflowRun(answering_url, "train", "T", "run")


@pytest.fixture
def wandb_session(tmp_path: Path, answering_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's W&B set up afresh in a home of its own, without an API key, its server a
    local stub; torn down after."""
    import wandb

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for name, value in offline_home(tmp_path / "home", answering_url).items():
        monkeypatch.setenv(name, value)
    wandb.teardown()
    yield tmp_path / "run"
    wandb.teardown()


def test_wandb_online_without_an_api_key_is_one_line_and_leaves_nothing(
    wandb_session: Path,
) -> None:
    # Was: wandb's UsageError as a traceback (exit 1), the run folder left behind.
    from fasttrain.callbacks import wandb_run
    from fasttrain.config.errors import UserError

    logger = wandb_run.WandbRun(str(wandb_session), "fasttrain", "T", offline=False)
    with pytest.raises(UserError) as caught:
        _ = logger.experiment
    line = str(caught.value)
    assert line.startswith("logger.wandb.offline=false: W&B could not start the run: No API key")
    assert "WANDB_API_KEY" in line and "wandb sync" in line and "\n" not in line
    assert not (wandb_session / "wandb").exists()


# ---- the run folder's MLflow run, found again by its id -------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One SQLite tracking store for the module (creating its tables takes seconds)."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('store')}/mlflow.db"
    MlflowClient(uri).search_experiments()
    return uri


@pytest.mark.parametrize("name", ["it's", "back\\slash", "both '\\' here"])
def test_a_run_folder_named_with_a_quote_continues_its_mlflow_run(
    store: str, tmp_path: Path, name: str
) -> None:
    # Was: found by a filter on the folder's tag, which MLflow's parser never matched for a ' or
    # a \ (it does not unescape \'): every continued run was a new MLflow run.
    from fasttrain.callbacks import mlflow_run

    run_dir = tmp_path / name
    first = mlflow_run.MLflowRun(store, "quotes", "T", str(run_dir)).run_id
    again = mlflow_run.MLflowRun(store, "quotes", "T", str(run_dir)).run_id
    assert again == first
    assert mlflow_run.RUN_ID_FILE == ID_FILE and (run_dir / ID_FILE).read_text().strip() == first


def other_run(store: str, kind: str) -> str:
    """A run id the file should not lead to: another experiment's run, or a deleted run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    found = client.get_experiment_by_name("elsewhere")
    where = found.experiment_id if found else client.create_experiment("elsewhere")
    if kind == "elsewhere":
        return str(client.create_run(where).info.run_id)
    here = client.get_experiment_by_name("edited")
    run = client.create_run(here.experiment_id if here else client.create_experiment("edited"))
    client.delete_run(run.info.run_id)
    return str(run.info.run_id)


@pytest.mark.parametrize(
    "content",
    ["not-a-run-id", "0" * 32, "../../" + "a" * 32, "a" * 32 + "' OR 1=1", "\xff", "elsewhere",
     "deleted", "fifo", "device"],
)  # fmt: skip
def test_an_edited_run_id_file_starts_a_new_run_said_in_one_line(
    store: str, tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture
) -> None:
    from fasttrain.callbacks import mlflow_run

    run_dir = tmp_path / "run"
    kept = run_dir / ID_FILE
    run_dir.mkdir()
    if content == "fifo":  # reading it would block
        os.mkfifo(kept)
    elif content == "device":  # reading it would never end
        kept.symlink_to("/dev/zero")
    elif content in ("elsewhere", "deleted"):
        kept.write_text(other_run(store, content))
    else:
        kept.write_bytes(content.encode("latin-1"))
    before = kept.read_text() if content in ("elsewhere", "deleted") else None
    with caplog.at_level(logging.WARNING, logger=mlflow_run.__name__):
        new = mlflow_run.MLflowRun(store, "edited", "T", str(run_dir)).run_id
    assert new != before
    (warning,) = [r.getMessage() for r in caplog.records if r.name == mlflow_run.__name__]
    assert ID_FILE in warning and "a new MLflow run" in warning
    assert kept.read_text().strip() == new  # the next continued run goes on as this one


@pytest.mark.slow  # two training runs (tens of seconds): CI runs it in make test-slow
def test_a_continued_run_named_with_a_quote_goes_on_as_the_same_mlflow_run(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    args = ["train.py", "logger=mlflow", *QUICK, "test=false", 'run_name="it\'s"']
    for epochs in (1, 2):
        proc = run_cli([*args, f"trainer.max_epochs={epochs}"], tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "train"]
    (run,) = client.search_runs([experiment.experiment_id])
    assert len(client.get_metric_history(run.info.run_id, "val/acc")) == 2  # one per epoch
