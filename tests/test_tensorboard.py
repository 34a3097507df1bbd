"""A short run, read back through a real TensorBoard server over its HTTP data API."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import run_cli, run_dirs

SHORT = ["trainer.max_epochs=2", "data.num_workers=0", "data.batch_size=256"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get_json(url: str, body: dict | None = None) -> object:
    data = json.dumps(body).encode() if body is not None else None
    # TensorBoard refuses POSTs without this header (its XSRF guard).
    headers = {"X-XSRF-Protected": "1", "Content-Type": "application/json"}
    req = urllib.request.Request(url, data=data, headers=headers)
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    logs = tmp_path_factory.mktemp("tb") / "logs"
    proc = run_cli(["train.py", *SHORT, "seed=7"], logs)
    assert proc.returncode == 0, proc.stderr
    return logs


@pytest.fixture(scope="module")
def server(log_dir: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(log_dir),
         "--host", "127.0.0.1", "--port", str(port), "--reload_interval", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if get_json(f"{url}/data/plugin/scalars/tags"):
                    break
            except OSError:
                pass
            assert proc.poll() is None, "tensorboard exited"
            time.sleep(0.5)
        else:
            pytest.fail("tensorboard listed no run within 60 s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_run_is_listed_by_name_with_its_overrides(server: str, log_dir: Path) -> None:
    tags = get_json(f"{server}/data/plugin/scalars/tags")
    assert isinstance(tags, dict) and len(tags) == 1
    (run,) = tags
    # <task>/<time>_<overrides>/tensorboard: readable, and what differs from the defaults
    task, name, leaf = run.split("/")
    assert (task, leaf) == ("train", "tensorboard")
    assert name.endswith("_data.batch_size=256,data.num_workers=0,seed=7,trainer.max_epochs=2")
    assert "paths.log_dir" not in name  # where files go is not what a run is about
    assert [d.name for d in run_dirs(log_dir)] == [name]


def test_scalars_are_served(server: str) -> None:
    tags = get_json(f"{server}/data/plugin/scalars/tags")
    assert isinstance(tags, dict)
    (run,) = tags
    assert {"val/acc", "val/loss", "train/loss_epoch"} <= set(tags[run])
    query = urllib.parse.urlencode({"run": run, "tag": "val/acc"})
    points = get_json(f"{server}/data/plugin/scalars/scalars?{query}")
    assert isinstance(points, list) and len(points) == 2  # one per epoch: [wall, step, value]
    assert all(0.0 <= value <= 1.0 for _, _, value in points)
    assert points[0][1] < points[1][1]


def test_hparams_tab_has_config_and_final_metrics(server: str) -> None:
    exp = get_json(f"{server}/data/plugin/hparams/experiment", {"experimentName": ""})
    assert isinstance(exp, dict)
    hparams = {h["name"]: h for h in exp["hparamInfos"]}
    assert {"seed", "model.optimizer.lr", "data.batch_size", "trainer.max_epochs"} <= set(hparams)
    metrics = {m["name"]["tag"] for m in exp["metricInfos"]}
    assert {"hp/val/acc", "hp/test/acc"} <= metrics
