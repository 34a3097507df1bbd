"""Screenshots of MLflow's pages and of the run-inspection notebook, as a user sees them, in
headless Chromium (the sibling of bench/tensorboard_view.py).

    python bench/ui_views.py          # writes bench/results/ui/*.png

The seven short runs of bench/seven_runs.py (three tasks: SmallCNN on digits three times, the
regressor on diabetes twice, a small byte-level GPT twice, each named by the override that tells
it apart) into a temporary folder, logged to TensorBoard and MLflow. Then `mlflow ui` on
127.0.0.1 over their store and Chromium (1400 wide, a fresh profile: no saved UI state) on:

- `mlflow_experiment.png`: the link a run prints (`MLflow view`), the experiment's runs, each
  name's overrides in the Run Name column's first characters;
- `mlflow_run.png`, `mlflow_run_metrics.png`: a classifier run's page and its Model metrics tab;

and `notebooks/inspect_runs.ipynb` executed over the same folder (nbconvert to HTML, outputs
only) as `notebook.png`. Headless Chromium may leave MLflow's chart lines undrawn.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import seven_runs

ROOT = seven_runs.ROOT
OUT = ROOT / "bench" / "results" / "ui"
LOGGERS = "[tensorboard,mlflow]"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def train_all(log_dir: Path, work: Path) -> str:
    """Trains the seven runs; returns the `MLflow view` link the last run printed."""
    link = ""
    for stdout in seven_runs.train(log_dir, work, LOGGERS):
        found = [ln for ln in stdout.splitlines() if ln.startswith("MLflow view")]
        link = found[-1].removeprefix("MLflow view").strip() if found else link
    return link


def serve(log_dir: Path, port: int) -> subprocess.Popen[bytes]:
    mlflow = Path(sys.executable).parent / "mlflow"
    proc = subprocess.Popen(
        [str(mlflow), "ui", "--backend-store-uri", f"sqlite:///{log_dir}/mlflow.db",
         "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError("mlflow ui did not answer within 120 s")


def screenshot(url: str, window: str, path: Path, budget_ms: int = 25000) -> None:
    with tempfile.TemporaryDirectory() as profile:  # no saved UI state: what a user first sees
        subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", f"--window-size={window}",
             f"--virtual-time-budget={budget_ms}", f"--user-data-dir={profile}",
             "--hide-scrollbars", f"--screenshot={path}", url],
            check=True, capture_output=True, timeout=300,
        )  # fmt: skip
    print(path)


def first_classifier_run(port: int) -> tuple[str, str]:
    """(experiment id, run id) of a classifier run (one with val/acc), through MLflow's API."""
    body = json.dumps({"experiment_ids": ["1"], "max_results": 50}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/search", body,
                                     {"Content-Type": "application/json"})  # fmt: skip
    runs = json.load(urllib.request.urlopen(request, timeout=30))["runs"]
    for run in runs:
        if any(m["key"] == "val/acc_best" for m in run["data"].get("metrics", [])):
            return run["info"]["experiment_id"], run["info"]["run_id"]
    raise RuntimeError("no classifier run in the store")


def notebook(log_dir: Path, work: Path) -> Path:
    html = work / "inspect_runs.html"
    env = {**os.environ, "FASTTRAIN_LOG_DIR": str(log_dir), "MPLBACKEND": "agg"}
    subprocess.run(
        [str(Path(sys.executable).parent / "jupyter"), "nbconvert", "--to", "html", "--execute",
         "--no-input", "--ExecutePreprocessor.timeout=300", "--output-dir", str(work),
         "--output", html.stem, str(ROOT / "notebooks" / "inspect_runs.ipynb")],
        check=True, capture_output=True, env=env, timeout=600,
    )  # fmt: skip
    return html


def main() -> None:
    if shutil.which("chromium") is None:
        sys.exit("needs headless Chromium: apt install chromium")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        log_dir = work / "logs"
        link = train_all(log_dir, work)
        screenshot(notebook(log_dir, work).as_uri(), "1400,2300", OUT / "notebook.png", 5000)
        port = free_port()
        server = serve(log_dir, port)
        try:
            base = f"http://127.0.0.1:{port}"
            screenshot(link.replace("http://127.0.0.1:5000", base), "1400,900",
                       OUT / "mlflow_experiment.png")  # fmt: skip
            experiment, run = first_classifier_run(port)
            page = f"{base}/#/experiments/{experiment}/runs/{run}"
            query = "?workflowType=machine_learning"
            screenshot(page + query, "1400,1100", OUT / "mlflow_run.png")
            screenshot(f"{page}/model-metrics{query}", "1400,2400", OUT / "mlflow_run_metrics.png")
        finally:
            server.terminate()
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
