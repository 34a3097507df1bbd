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
