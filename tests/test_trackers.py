"""logger=mlflow and logger=wandb (fasttrain.callbacks.trackers), read back through each tool's
own files and client: the run as TensorBoard's HPARAMS session has it (hyperparameters, tags,
final values), the same steps, the checkpoint, and the commands printed at the end. One run with
`logger=many`, started as a user types it (no path overrides), shared by the tests."""

from __future__ import annotations

import json
import shlex
import socket
import struct
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_reliability_run_sweeps import train

from conftest import REPO, scalar_steps, session_hparams, wait_for

pytest.importorskip("mlflow")
pytest.importorskip("wandb")

ARGS = ["logger=many", "tags=[baseline,t2]", "model=mlp", "trainer.max_epochs=2",
        "data.num_workers=0", "callbacks.progress_bar=null", "run_name=T"]  # fmt: skip


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path]:
    """(the finished `python train.py logger=many ...`, the folder it was started in)."""
    where = tmp_path_factory.mktemp("tracked")
    proc = train(ARGS, where)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, where


def run_dir(where: Path) -> Path:
    return where / "logs" / "train" / "T"


def recorded(where: Path) -> dict[str, Any]:
    return json.loads((run_dir(where) / "metrics.json").read_text())


def as_text(hparams: dict[str, Any]) -> dict[str, str]:
    """TensorBoard's typed session values as MLflow keeps params (text; 64 as "64")."""
    integral = {k: int(v) for k, v in hparams.items() if isinstance(v, float) and v.is_integer()}
    return {k: str(v) for k, v in (hparams | integral).items()}


# ---- MLflow -----------------------------------------------------------------------------------
def mlflow_run(where: Path) -> Any:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{where}/logs/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "train"]
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1, [r.info.run_name for r in runs]
    return client, runs[0]


def test_mlflow_keeps_the_run_as_tensorboard_does(tracked) -> None:
    _, where = tracked
    client, run = mlflow_run(where)
    assert run.info.run_name == "T" and run.info.status == "FINISHED"
    # the same chosen hyperparameters as TensorBoard's HPARAMS session (tags among them)
    assert run.data.params == as_text(session_hparams(run_dir(where)))
    assert run.data.params["tags"] == "baseline,t2" and run.data.params["model"] == "mlp"
    assert {"baseline", "t2"} <= set(run.data.tags)
    record = recorded(where)
    assert run.data.tags["checkpoint"] == str(Path(record["checkpoint"]).absolute())
    # the final values are the metrics' latest values; no `final/*` copies (one-point charts)
    assert not [k for k in run.data.metrics if k.startswith("final/")]
    for name in ("test/acc", "val/acc", "val/acc_best", "val/loss"):
        assert run.data.metrics[name] == pytest.approx(record["metrics"][name]), name
    # one step convention: x = optimizer steps completed, as in TensorBoard
    for tag in ("val/acc", "train/loss_step", "lr"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, tag)]
        assert steps == scalar_steps(run_dir(where), tag), tag
    assert "epoch" not in run.data.metrics


def test_mlflow_opens_on_model_training_with_the_config_and_summary_as_artifacts(tracked) -> None:
    """The experiment is of MLflow 3's kind for model training (its UI offered GenAI pages, an
    empty overview); the composed config, the overrides and the performance summary are files of
    the run, byte for byte the run folder's; no checkpoint is copied by default."""
    from mlflow.artifacts import download_artifacts

    from fasttrain.callbacks.mlflow_run import EXPERIMENT_KIND, VIEW_TAG

    proc, where = tracked
    client, run = mlflow_run(where)
    key, kind = EXPERIMENT_KIND
    assert client.get_experiment(run.info.experiment_id).tags[key] == kind
    listed = {f.path for f in client.list_artifacts(run.info.run_id)}
    assert listed == {"config", "perf_summary.json"}, listed
    assert {f.path for f in client.list_artifacts(run.info.run_id, "config")} == {
        "config/config.yaml", "config/overrides.yaml"}  # fmt: skip
    got = download_artifacts(run_id=run.info.run_id, artifact_path="config/config.yaml",
                             dst_path=str(where / "got"),
                             tracking_uri=f"sqlite:///{where}/logs/mlflow.db")  # fmt: skip
    assert Path(got).read_bytes() == (run_dir(where) / ".hydra" / "config.yaml").read_bytes()
    # the run page's Description: the final test and val values, test first
    note = run.data.tags["mlflow.note.content"].splitlines()
    final = recorded(where)["metrics"]
    assert note[4] == f"| test/acc | {final['test/acc']:.4g} |"
    assert f"| val/acc_best | {final['val/acc_best']:.4g} |" in note
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("MLflow view")]
    url = line.removeprefix("MLflow view").strip()
    assert url == (f"http://127.0.0.1:5000/#/experiments/{run.info.experiment_id}/runs"
                   "?workflowType=machine_learning&viewStateShareKey=fasttrain")  # fmt: skip
    # The view that link opens: the task's results as the Runs table's first columns (without
    # it the table has no metric column), each a metric the run has.
    view = json.loads(client.get_experiment(run.info.experiment_id).tags[VIEW_TAG])
    columns = ["val/acc", "val/acc_best", "val/loss", "test/acc", "test/loss"]
    assert view["selectedColumns"] == view["columnOrder"] == [f"metrics.`{c}`" for c in columns]
    assert set(columns) <= set(run.data.metrics)


def test_each_tasks_runs_add_their_columns_to_the_view(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from fasttrain.callbacks.mlflow_run import VIEW_TAG, MLflowRun

    uri = f"sqlite:///{tmp_path}/mlflow.db"

    def columns_after(monitor: str | None, name: str) -> list[str]:
        run = MLflowRun(uri, "e", name, str(tmp_path / name))
        run.monitor = monitor
        run.experiment  # noqa: B018  (starts the run)
        tags = MlflowClient(uri).get_experiment(run.experiment_id).tags
        return [c.split("`")[1] for c in json.loads(tags[VIEW_TAG])["selectedColumns"]]

    classifier = ["val/acc", "val/acc_best", "val/loss", "test/acc", "test/loss"]
    assert columns_after("val/acc", "a") == classifier
    assert columns_after("val/acc", "b") == classifier  # a second run of the task: the same
    assert columns_after("val/mse", "c") == [*classifier, "val/mse", "val/mse_best", "test/mse"]
    assert columns_after(None, "d")[-1] == "test/mse"  # a plain module: the losses, kept
    # A tag that is not such a view (edited by hand) is replaced, not a crash.
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("e").experiment_id
    for junk in ("not json", '["a"]', '{"selectedColumns": "metrics.`x`"}'):
        client.set_experiment_tag(experiment, VIEW_TAG, junk)
        assert columns_after("val/acc", f"junk{len(junk)}") == classifier


def test_an_experiment_kind_chosen_in_the_ui_stays(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient

    from fasttrain.callbacks.mlflow_run import EXPERIMENT_KIND, MLflowRun

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    first = MLflowRun(uri, "e", "a", str(tmp_path / "a"))
    client = first.experiment
    client.set_experiment_tag(first.experiment_id, EXPERIMENT_KIND[0], "finetuning")
    second = MLflowRun(uri, "e", "b", str(tmp_path / "b"))
    second.experiment  # noqa: B018  (starts the run)
    fresh = MLflowRun(uri, "f", "c", str(tmp_path / "c"))
    fresh.experiment  # noqa: B018
    kinds = [MlflowClient(uri).get_experiment(run.experiment_id).tags[EXPERIMENT_KIND[0]]
             for run in (second, fresh)]  # fmt: skip
    assert kinds == ["finetuning", EXPERIMENT_KIND[1]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow  # starts MLflow's server (seconds): CI runs it in make test-slow
def test_the_printed_mlflow_ui_command_shows_the_run(tracked) -> None:
    proc, where = tracked
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("MLflow  ")]
    command = shlex.split(line.removeprefix("MLflow").strip())
    assert command[1] == "ui" and command[-6:] == ["--host", "127.0.0.1", "--port", "5000",
                                                   "--workers", "1"]  # fmt: skip
    port = free_port()  # the printed command as it is, on a port free here
    server = subprocess.Popen(
        [*command[:-3], str(port), *command[-2:]],
        cwd=where, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        body = json.dumps({"experiment_ids": ["1"], "max_results": 5}).encode()
        url = f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/search"

        def searched() -> dict:
            request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            return json.load(urllib.request.urlopen(request, timeout=5))

        answer = wait_for(searched, 120, "the MLflow server answering a run search", server)
        assert [r["info"]["run_name"] for r in answer["runs"]] == ["T"]
    finally:
        server.terminate()
        server.wait(timeout=30)


# ---- W&B --------------------------------------------------------------------------------------
BLOCK = 32 * 1024  # W&B's offline run file: LevelDB's log format, 32 KiB blocks


def wandb_records(path: Path) -> list[Any]:
    """Every record of an offline run file (`run-<id>.wandb`), as W&B's protobuf messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B run file"
    found, pos, chunk = [], 7, b""
    while pos + 7 <= len(data):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zeros to the block's end
            pos += BLOCK - pos % BLOCK
            continue
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or its last piece
            record = pb.Record()
            record.ParseFromString(chunk)
            found.append(record)
            chunk = b""
    return found


def wandb_run_files(where: Path) -> list[Path]:
    return sorted((run_dir(where) / "wandb").glob("offline-run-*/run-*.wandb"))


def key_of(item: Any) -> str:
    """An item's name: W&B keeps a name with "/" as its parts (`nested_key`) or whole (`key`)."""
    return item.key or "/".join(item.nested_key)


def of_kind(records: list[Any], kind: str) -> list[Any]:
    return [r for r in records if r.WhichOneof("record_type") == kind]


def test_wandb_offline_run_keeps_the_run_as_tensorboard_does(tracked) -> None:
    _, where = tracked
    (path,) = wandb_run_files(where)
    records = wandb_records(path)
    (run,) = [r.run for r in of_kind(records, "run")]
    assert run.display_name == "T" and list(run.tags) == ["baseline", "t2"]
    assert run.project == "fasttrain" and run.run_group == "train"  # the project, the task
    config = {key_of(i): json.loads(i.value_json) for r in of_kind(records, "config")
              for i in r.config.update if not key_of(i).startswith("_")}  # fmt: skip
    assert as_text(session_hparams(run_dir(where))) == {k: str(v) for k, v in config.items()}
    summary: dict[str, Any] = {}
    for r in of_kind(records, "summary"):
        summary |= {key_of(i): json.loads(i.value_json) for i in r.summary.update}
    record = recorded(where)
    assert summary["checkpoint"] == str(Path(record["checkpoint"]).absolute())
    assert summary["final/test/acc"] == pytest.approx(record["metrics"]["test/acc"])
    # one step convention: W&B's x is Lightning's trainer/global_step, as TensorBoard's step
    history = [{key_of(i): json.loads(i.value_json) for i in r.history.item}
               for r in of_kind(records, "history")]  # fmt: skip
    for tag in ("val/acc", "train/loss_step"):
        steps = [row["trainer/global_step"] for row in history if tag in row]
        assert steps == scalar_steps(run_dir(where), tag), tag
    assert not any("epoch" in row for row in history)
    assert of_kind(records, "exit"), "the run was not finished"


def test_printed_commands_name_what_each_tracker_wrote(tracked) -> None:
    proc, where = tracked
    lines = {x.split(maxsplit=1)[0]: x.split(maxsplit=1)[1] for x in proc.stdout.splitlines()
             if x.startswith(("MLflow  ", "W&B ", "TensorBoard "))}  # fmt: skip
    exe, ui, flag, uri, *_ = shlex.split(lines["MLflow"])
    assert Path(exe).parent == Path(sys.executable).parent
    assert (ui, flag) == ("ui", "--backend-store-uri")
    assert uri == f"sqlite:///{where}/logs/mlflow.db"
    exe, sync, folder = shlex.split(lines["W&B"])
    assert sync == "sync" and Path(folder) == wandb_run_files(where)[0].parent
    assert "[baseline,t2]" in proc.stdout  # paths with a list override printed as they are


def test_a_missing_tracker_package_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from fasttrain.callbacks import mlflow_run, trackers, wandb_run
    from fasttrain.config.errors import UserError

    monkeypatch.setattr(trackers, "installed", lambda module: False)
    with pytest.raises(UserError, match=r"logger=mlflow needs the mlflow package: pip install"):
        mlflow_run.MLflowRun("sqlite:///x.db", "train", "T", "run")
    with pytest.raises(UserError, match=r"logger=wandb needs the wandb package: pip install"):
        wandb_run.WandbRun("run", "p", "T")


@pytest.mark.parametrize("tags", ["a!", ["a", ["b"]], ["x" * 65], [1]])
def test_bad_tags_say_what_a_tag_may_be(tags: Any) -> None:
    from fasttrain.config.errors import ConfigError
    from fasttrain.config.settings import run_tags

    with pytest.raises(ConfigError, match=r"^tags=.*: expected a list of names of letters"):
        run_tags(tags)
    assert run_tags("solo") == ["solo"] and run_tags(["a b", "v1.2/x"]) == ["a b", "v1.2/x"]


def test_bad_tags_are_one_line_and_nothing_written(tmp_path: Path) -> None:
    proc = train(["logger=many", "tags=[a,'b!']", "run_name=B"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: tags=") and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow  # a second run (seconds): CI runs it in make test-slow
def test_a_continued_run_goes_on_as_the_same_tracked_run(tracked) -> None:
    _, where = tracked
    again = train([*ARGS[:3], "trainer.max_epochs=3", *ARGS[4:]], where)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Restored all states" in again.stderr
    client, run = mlflow_run(where)  # still one MLflow run, now with the third epoch
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "val/acc")]
    assert steps == scalar_steps(run_dir(where), "val/acc") and len(steps) == 3
    first, second = wandb_run_files(where)  # one offline folder per process, one W&B run id
    assert first.name == second.name
    history = [r.history for r in of_kind(wandb_records(second), "history")]
    assert history, "the continued run recorded nothing"


@pytest.mark.slow  # two runs at once (tens of seconds): CI runs it in make test-slow
def test_two_runs_at_once_share_a_new_mlflow_database(tmp_path: Path) -> None:
    # Both create the database's tables and the experiment: without a lock the second failed
    # ("duplicate column name") before its first step.
    from test_reliability_run_sweeps import user_env

    args = ["logger=mlflow", "model=mlp", "trainer.max_epochs=1", "data.num_workers=0",
            "callbacks.progress_bar=null", "test=false"]  # fmt: skip
    command = [sys.executable, str(REPO / "train.py"), *args]
    procs = [
        subprocess.Popen([*command, f"run_name=r{i}"], cwd=tmp_path, env=user_env(),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for i in range(2)
    ]  # fmt: skip
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/logs/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "train"]
    names = sorted(r.info.run_name for r in client.search_runs([experiment.experiment_id]))
    assert names == ["r0", "r1"]


@pytest.mark.slow  # a sweep of two short runs with MLflow (~30 s): CI runs it in make test-slow
def test_a_run_has_one_name_in_its_folder_tensorboard_mlflow_and_wandb(tmp_path: Path) -> None:
    # The default name holds the time: read again when MLflow started, a sweep job's MLflow run
    # was `<time>_seed=1` while its folder (and TensorBoard) said `multirun/<time>/0_seed=1`.
    from mlflow.tracking import MlflowClient
    from test_reliability_run_sweeps import jobs_of

    # The two jobs differ in log_model: the best checkpoint's file is uploaded only when asked.
    args = ["-m", "logger=many", "model=mlp", "trainer.max_epochs=1", "data.num_workers=0",
            "callbacks.progress_bar=null", "test=false",
            "logger.mlflow.log_model=false,true"]  # fmt: skip
    proc = train(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    home = tmp_path / "logs" / "train"
    folders = [job.relative_to(home).as_posix() for job in jobs_of(tmp_path)]
    assert len(folders) == 2 and all(name.startswith("multirun/") for name in folders), folders
    # TensorBoard's run is the folder (its events are in it); W&B's is the run's display name
    for job, folder in zip(jobs_of(tmp_path), folders, strict=True):
        (file,) = (job / "wandb").glob("offline-run-*/run-*.wandb")
        (run,) = [r.run for r in of_kind(wandb_records(file), "run")]
        assert run.display_name == folder and list(job.glob("events.out.tfevents.*"))
    client = MlflowClient(f"sqlite:///{tmp_path}/logs/mlflow.db")
    (experiment,) = [e for e in client.search_experiments() if e.name == "train"]
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in runs) == folders
    for r in runs:
        best = Path(r.data.tags["checkpoint"])
        uploaded = {f.path for f in client.list_artifacts(r.info.run_id)} - {"config"}
        if "log_model=True" not in r.info.run_name:
            assert uploaded == {"perf_summary.json"}, uploaded
            continue
        assert uploaded == {"perf_summary.json", "checkpoint"}, uploaded
        (file,) = client.list_artifacts(r.info.run_id, "checkpoint")
        assert file.path == f"checkpoint/{best.name}" and "last" not in file.path
        got = Path(client.download_artifacts(r.info.run_id, file.path, str(tmp_path / "got")))
        assert got.read_bytes() == best.read_bytes()


def test_log_model_takes_what_lightning_does(tmp_path: Path) -> None:
    from fasttrain.callbacks.mlflow_run import MLflowRun
    from fasttrain.config.errors import ConfigError

    with pytest.raises(ConfigError, match=r"^log_model='yes': expected false .*, true .* or all"):
        MLflowRun(f"sqlite:///{tmp_path}/m.db", "e", "r", str(tmp_path), log_model="yes")
    assert not list(tmp_path.iterdir())  # refused before the store is made
