"""A run that cannot be continued is refused before anything in its folder changes; resume=never
keeps the old run beside the new one; a run's log holds its lines, Lightning's included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_reliability_run_names import main_in
from test_reliability_run_sweeps import train, user_env

SHORT = ["model=mlp", "data.num_workers=0", "logger=tensorboard", "trainer.limit_train_batches=2",
         "trainer.limit_val_batches=2", "test=false", "callbacks.progress_bar=null"]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """`python train.py ... run_name=R` from an empty folder, 3 epochs: (launch folder, proc)."""
    launch = tmp_path_factory.mktemp("launch")
    proc = train([*SHORT, "trainer.max_epochs=3", "run_name=R"], launch)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return launch, proc


@pytest.fixture
def run(trained: tuple[Path, subprocess.CompletedProcess], tmp_path: Path) -> Path:
    """A fresh copy of the trained run's launch folder (this test may break it)."""
    shutil.copytree(trained[0], tmp_path, dirs_exist_ok=True)
    return tmp_path / "logs" / "train" / "R"


def contents(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def best_checkpoint(run: Path) -> Path:
    (best,) = (p for p in (run / "checkpoints").glob("*.ckpt") if p.name != "last.ckpt")
    return best


@pytest.mark.slow  # 10-15 s of processes: CI runs it in make test-slow
def test_run_log_holds_lightnings_lines_once(trained) -> None:
    launch, proc = trained
    log = (launch / "logs" / "train" / "R" / "train.log").read_text()
    for line in ("Seed set to 42", "GPU available", "`Trainer.fit` stopped"):
        assert log.count(line) == 1, (line, log)
    assert (proc.stdout + proc.stderr).count("GPU available") == 1


def test_truncated_last_checkpoint_is_refused_and_nothing_changes(
    run: Path, monkeypatch, capsys
) -> None:
    last = run / "checkpoints" / "last.ckpt"
    os.truncate(last, 1000)
    before = contents(run.parents[2])
    code, err = main_in(run.parents[2], [*SHORT, "trainer.max_epochs=3", "run_name=R"],
                        monkeypatch, capsys)  # fmt: skip
    assert code == 2
    assert len(err) == 1, err
    best = best_checkpoint(run).relative_to(run.parents[2])
    assert err[0].startswith("error: resume=auto: logs/train/R/checkpoints/last.ckpt: ")
    assert f"resume={best}" in err[0] and "resume=never" in err[0]
    assert contents(run.parents[2]) == before  # .hydra/ and train.log included


def test_checkpoint_of_another_model_is_refused_and_nothing_changes(
    run: Path, monkeypatch, capsys
) -> None:
    before = contents(run.parents[2])
    argv = [*SHORT, "model=cnn", "trainer.max_epochs=3", "run_name=R"]
    code, err = main_in(run.parents[2], argv, monkeypatch, capsys)
    assert code == 2
    assert len(err) == 1 and "different model" in err[0] and "resume=never" in err[0], err
    assert contents(run.parents[2]) == before


def test_refusal_outside_logs_leaves_the_folder_as_it_was(
    run: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    # hydra.run.dir outside logs/: the old clean-up spared it, but Hydra had already rewritten
    # .hydra/overrides.yaml with the failed command.
    elsewhere = tmp_path / "elsewhere" / "R"
    shutil.move(run, elsewhere)
    os.truncate(elsewhere / "checkpoints" / "last.ckpt", 1000)
    before = contents(elsewhere)
    argv = [*SHORT, "trainer.max_epochs=3", f"hydra.run.dir={elsewhere}"]
    code, err = main_in(tmp_path, argv, monkeypatch, capsys)
    assert code == 2 and len(err) == 1 and "not a readable checkpoint" in err[0], err
    assert contents(elsewhere) == before


def test_fewer_max_epochs_than_done_is_one_line(run: Path, monkeypatch, capsys) -> None:
    epoch = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["epoch"]
    before = contents(run.parents[2])
    argv = [*SHORT, f"trainer.max_epochs={epoch - 1}", "run_name=R"]
    code, err = main_in(run.parents[2], argv, monkeypatch, capsys)
    assert code == 2
    assert err == [
        f"error: trainer.max_epochs={epoch - 1}: logs/train/R/checkpoints/last.ckpt, the "
        f"checkpoint to resume, is at epoch {epoch}; set trainer.max_epochs={epoch} or more, or "
        "start over with resume=never"
    ]
    assert contents(run.parents[2]) == before


@pytest.mark.slow  # 10-15 s of processes: CI runs it in make test-slow
def test_resume_never_keeps_the_old_run_beside_the_new_one(run: Path) -> None:
    launch = run.parents[2]
    old = contents(run)
    proc = train([*SHORT, "trainer.max_epochs=1", "run_name=R", "resume=never"], launch)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (aside,) = (launch / "logs" / "train").glob("R.replaced-*")
    assert contents(aside) == {**old, ".run.lock": contents(aside)[".run.lock"]}
    said = [line for line in proc.stderr.splitlines() if line.startswith("resume=never")]
    assert said == [
        f"resume=never: the previous run in logs/train/R is kept in logs/train/{aside.name}"
    ]
    # The new run holds its own files only: one epoch, its own events and best checkpoint.
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 0
    events = sorted(p.name for p in run.glob("events.out.tfevents.*"))
    assert events and not set(events) & {p.name for p in aside.iterdir()}
    assert len(list((run / "checkpoints").glob("epoch*.ckpt"))) == 1
    assert "resume=never" in (run / "train.log").read_text()


@pytest.mark.slow  # 10-15 s of processes: CI runs it in make test-slow
def test_evaluate_as_written_from_the_launch_folder(trained) -> None:
    """Another entry point through the same skeleton (check, claim, Hydra): its run lands under
    the launch folder's logs/eval/, with its log."""
    launch, _ = trained
    ckpt = "logs/train/R/checkpoints/last.ckpt"
    proc = subprocess.run(
        [sys.executable, "-m", "fasttrain.evaluate", f"ckpt_path={ckpt}", "data.num_workers=0"],
        cwd=launch, env=user_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    (eval_run,) = (launch / "logs" / "eval").iterdir()
    assert (eval_run / "metrics.json").is_file()
    assert "GPU available" in (eval_run / "eval.log").read_text()
