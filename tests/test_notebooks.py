"""Every notebook under notebooks/ runs top to bottom against runs made here, so none goes
stale; and none is committed with outputs (diffs stay reviewable)."""

from __future__ import annotations

import json
from itertools import takewhile
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


# A log folder with runs of every task, as a notebook user would have one: two classifiers that
# differ in one override (seed), the regressor and a small language model, all two epochs.
COMMON = ["trainer.max_epochs=2", "data.num_workers=0", "callbacks.progress_bar=null"]
TASKS = {
    "classifier": ["-m", "seed=1,2", "data.batch_size=256"],
    "regressor": ["model=regressor", "data=diabetes"],
    "language model": ["model=gpt", "data=text", "data.block_size=32", "data.batch_size=8",
                       "data.val_fraction=0.2", "data.test_fraction=0.2",
                       "data.windows_per_epoch=64", "data.eval_windows=8", "model.net.n_layer=1",
                       "model.net.n_embd=32", "model.net.n_head=2"],
}  # fmt: skip


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from concurrent.futures import ThreadPoolExecutor

    from test_language_model import write_corpus

    root = tmp_path_factory.mktemp("nb")
    logs, corpus = root / "logs", write_corpus(root / "corpus")
    extra = {"language model": [f"data.path={corpus}", f"paths.data_dir={root / 'data'}"]}
    with ThreadPoolExecutor(len(TASKS)) as pool:  # three processes at once
        # -m (the classifiers' sweep) before the overrides
        procs = pool.map(lambda task: run_cli(["train.py", *TASKS[task], *COMMON,
                                               *extra.get(task, [])], logs), TASKS)  # fmt: skip
        for proc in procs:
            assert proc.returncode == 0, proc.stderr[-3000:]
    return logs


# Appended to the executed notebook: what its figures and table hold, as JSON.
PROBE = """
import json
print("PROBE" + json.dumps({
    "figures": {task: {"titles": [ax.get_title() for ax in fig.axes],
                       "labels": [t.get_text() for leg in fig.legends for t in leg.get_texts()]}
                for task, fig in figures.items()},
    "columns": list(runs.columns),
    "cells": [str(v) for v in runs.astype(str).to_numpy().ravel()],
    "table": runs.to_string(),
}))
"""


@pytest.mark.slow  # four training runs, then a kernel (~2 min on 2 cores): make test-slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path: Path, log_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    monkeypatch.setenv("FASTTRAIN_LOG_DIR", str(log_dir))
    monkeypatch.setenv("MPLBACKEND", "agg")
    nb = nbformat.read(path, as_version=4)
    if path.name == "inspect_runs.ipynb":
        nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    ).execute()  # raises CellExecutionError, naming the cell, on any error
    outputs = [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]
    text = "\n".join(
        str(out.get("text", "")) + str(out.get("data", {}).get("text/plain", "")) for out in outputs
    )
    if path.name != "inspect_runs.ipynb":
        return
    assert "4 runs under" in text
    # Runs are labelled by what differs within their task; what the task's runs share is said once.
    lines = text.splitlines()
    first = next(i for i, ln in enumerate(lines) if ln.startswith("classifier: 2 runs"))
    wrapped = takewhile(lambda ln: ln.startswith("  "), lines[first + 1 :])
    common = " ".join([lines[first], *wrapped])
    assert "max_epochs=2" in common and "seed" not in common
    probe = json.loads(next(ln for ln in text.splitlines() if ln.startswith("PROBE"))[5:])
    figures = probe["figures"]
    # one figure per task, each with its own charts: the loss, then the task's metric
    assert set(figures) == set(TASKS), figures.keys()
    assert sum("image/png" in out.get("data", {}) for out in outputs) == len(TASKS)
    assert figures["classifier"]["titles"] == ["loss", "acc"]
    assert figures["regressor"]["titles"] == ["loss", "mse"]
    assert figures["language model"]["titles"] == ["loss", "bpb"]  # not the classifiers' acc
    # short legend labels: the runs of the task by what differs, then the line styles
    for task, fig in figures.items():
        assert all(len(label) <= 30 for label in fig["labels"]), fig["labels"]
        assert len(fig["labels"]) <= 3 + (2 if task == "classifier" else 1), fig["labels"]
    assert {"seed=1", "seed=2"} <= set(figures["classifier"]["labels"])
    # a table that fits: few columns, short cells, no per-layer or other tag lists
    assert len(probe["columns"]) <= 8 and all(len(c) <= 12 for c in probe["columns"])
    assert all(len(cell) <= 30 for cell in probe["cells"]), probe["cells"]
    assert max(len(line) for line in probe["table"].splitlines()) <= 120, probe["table"]
    assert "grad_norm" not in text


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
