"""Shared helpers: run the entry points as a user would (subprocess), offline and on CPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

REPO = Path(__file__).resolve().parents[1]
# the generic tests' plugin (fasttrain.testing): markers, a clean Hydra state per test
pytest_plugins = ["fasttrain.testing.plugin"]
CONF = REPO / "conf"
DOCS = REPO / "docs"  # one page per topic, each linked from README.md


def doc(name: str) -> str:
    """The text of docs/<name>.md, e.g. doc("sweeps")."""
    return (DOCS / f"{name}.md").read_text()


def all_docs() -> str:
    """README.md and every docs/*.md page, joined: for text that may be on any of them."""
    pages = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
    return "\n".join(page.read_text() for page in pages)


def run_cli(
    args: list[str], log_dir: Path, timeout: float = 300, cwd: Path = REPO, **env: str
) -> subprocess.CompletedProcess:
    """`python <args> paths.log_dir=<log_dir>` (from the repository root by default), no GPU."""
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **env}
    if "PYTHONPATH" in env and os.environ.get("PYTHONPATH"):
        # extend, not replace: a generated project's tests find its package through it
        full_env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], os.environ["PYTHONPATH"]])
    full_env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, *args, f"paths.log_dir={log_dir}"],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


T = TypeVar("T")


def wait_for(
    condition: Callable[[], T],
    within: float,
    what: str,
    process: subprocess.Popen | None = None,
    every: float = 0.5,
) -> T:
    """The first true value `condition()` gives, asked every `every` s: for a server or a
    background run to reach a state, never a fixed sleep (a loaded machine is slower than any
    guess). An OSError counts as "not yet" (a server not listening yet). Fails naming `what`
    after `within` s, or as soon as `process` exits (it would never get there)."""
    deadline = time.monotonic() + within
    while True:
        try:
            value = condition()
        except OSError:
            value = None  # type: ignore[assignment]
        if value:
            return value
        if process is not None and process.poll() is not None:
            pytest.fail(f"{what}: the process ended first (exit {process.returncode})")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {within:g} s")
        time.sleep(every)


def run_dirs(log_dir: Path, task: str = "train") -> list[Path]:
    """Run folders (those Hydra wrote a config into) under log_dir/<task>/."""
    return sorted(p.parent.parent for p in (log_dir / task).glob("*/.hydra/config.yaml"))


def final_metrics(run_dir: Path) -> dict[str, float]:
    return json.loads((run_dir / "metrics.json").read_text())["metrics"]


def _events(folder: Path) -> Any:  # one TensorBoard run folder, read whole
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def scalars(run_dir: Path) -> dict[str, list[float]]:
    """Every scalar the run showed in TensorBoard's curves, by the name logged -> its values in
    step order."""
    from fasttrain.callbacks.board import read_scalars

    return {name: [v for _, v in points] for name, points in read_scalars(run_dir).items()}


def scalar_steps(run_dir: Path, name: str) -> list[int]:
    from fasttrain.callbacks.board import read_scalars

    return [step for step, _ in read_scalars(run_dir)[name]]


def verdict(run_dir: Path) -> dict[str, list[float]]:
    """The run's HPARAMS metrics (`verdict/...` in its session run `hparams/`) -> values."""
    from fasttrain.callbacks.board import SESSION_RUN

    acc = _events(run_dir / SESSION_RUN)
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def session_hparams(run_dir: Path) -> dict[str, bool | float | str]:
    """The hyperparameters of the run's HPARAMS session, as written to its events."""
    from google.protobuf.json_format import MessageToDict
    from tensorboard.plugins.hparams import metadata

    from fasttrain.callbacks.board import SESSION_RUN

    acc = _events(run_dir / SESSION_RUN)
    content = acc.SummaryMetadata(metadata.SESSION_START_INFO_TAG).plugin_data.content
    info = metadata.parse_session_start_info_plugin_data(content)
    return {k: MessageToDict(v) for k, v in info.hparams.items()}


@pytest.fixture(scope="session")
def mlp_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """last.ckpt of a short CPU run (MLP on digits, 3 epochs), trained once per test session for
    the tests that only need some trained checkpoint (export, predict)."""
    log_dir = tmp_path_factory.mktemp("mlp_run")
    args = ["train.py", "model=mlp", "trainer.max_epochs=3", "data.num_workers=0", "logger=none",
            "run_name=mlp"]  # fmt: skip
    proc = run_cli(args, log_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return log_dir / "train" / "mlp" / "checkpoints" / "last.ckpt"


def make_new_project(dest: Path, name: str = "acme_vision") -> subprocess.CompletedProcess:
    """`make new-project NAME=name DEST=dest` in this checkout (its template as committed)."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    return subprocess.run(
        ["make", "-s", "new-project", f"NAME={name}", f"DEST={dest}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="session")
def new_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project `make new-project` made (acme_vision), once per test session and worker: a
    render and a wheel build take a while. A test that changes it works on a git clone."""
    dest = tmp_path_factory.mktemp("new") / "acme_vision"
    proc = make_new_project(dest)
    assert proc.returncode == 0, proc.stderr
    return dest
