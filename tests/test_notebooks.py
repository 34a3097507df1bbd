"""Every notebook under notebooks/ runs top to bottom against runs made here, so none goes
stale; and none is committed with outputs (diffs stay reviewable)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, run_cli

NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, "notebooks/ is empty"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{path.name} has outputs: clear them before committing"
            )


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Two runs that differ in one override, as a notebook user would compare them.
    logs = tmp_path_factory.mktemp("nb") / "logs"
    proc = run_cli(
        ["train.py", "-m", "seed=1,2", "trainer.max_epochs=2", "data.batch_size=256",
         "data.num_workers=0"],
        logs,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return logs


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path: Path, log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("FASTTRAIN_LOG_DIR", str(log_dir))
    monkeypatch.setenv("MPLBACKEND", "agg")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()  # raises CellExecutionError, naming the cell, on any error
    text = "\n".join(
        str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", ""))
        for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs
    )  # fmt: skip
    if path.name == "inspect_runs.ipynb":
        assert "2 runs under" in text
        assert "seed=1" in text and "seed=2" in text  # each run's overrides are shown
        # Runs are labelled by what differs; what all share is said once.
        common = next(ln for ln in text.splitlines() if "common to all:" in ln)
        assert "trainer.max_epochs=2" in common and "seed" not in common


def answer(url: str, within: float = 30.0) -> bytes:
    """The body at `url`, waiting while the server is not listening yet."""
    import time
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + within
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return bytes(resp.read())
        except urllib.error.HTTPError:
            raise
        except urllib.error.URLError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_make_notebook_serves_the_notebooks_on_localhost_behind_a_token() -> None:
    """`make notebook` as the docs give it: JupyterLab on 127.0.0.1 over notebooks/, answering
    with the printed token only; stopped here."""
    import contextlib
    import json
    import os
    import re
    import signal
    import socket
    import subprocess
    import time
    import urllib.error
    import urllib.request

    if not (REPO / ".venv" / "bin" / "jupyter-lab").exists():
        pytest.skip("JupyterLab is not installed in .venv (make install installs it)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # -o: the installed stamp counts as up to date (this suite runs from that very .venv)
    command = ["make", "--no-print-directory", "-o", ".venv/.installed", "notebook",
               f"NB_PORT={port}"]  # fmt: skip
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        printed, token = "", None
        deadline = time.monotonic() + 60
        while token is None and time.monotonic() < deadline and proc.poll() is None:
            line = proc.stdout.readline() if proc.stdout else ""
            printed += line
            found = re.search(rf"http://127\.0\.0\.1:{port}/lab\?token=(\w+)", line)
            token = found.group(1) if found else None
        assert token, printed[-2000:]
        api = f"http://127.0.0.1:{port}/api/contents"
        listed = json.loads(answer(f"{api}?token={token}"))["content"]
        assert {item["name"] for item in listed} >= {p.name for p in NOTEBOOKS}, listed
        with pytest.raises(urllib.error.HTTPError, match="403"):  # no token: refused
            urllib.request.urlopen(api, timeout=10)
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have exited already
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
