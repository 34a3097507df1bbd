"""SIGTERM (what `timeout` and SLURM send, to the whole process group) and Ctrl-C (SIGINT to the
group) stop a run the same documented way: last.ckpt after the current batch, exit 143 (130),
and one line with the command that continues the run, which is true wherever the checkpoint
went (callbacks=none included)."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_reliability_run_sweeps import train, user_env
from torch.utils.data import DataLoader, Dataset

from conftest import REPO, wait_for
from fasttrain.data.base import worker_init
from fasttrain.fit import ctrl_c_as_sigterm

TESTS_DIR = str(Path(__file__).parent)


class Dispositions(Dataset):
    """Each item: whether this (worker) process ignores SIGTERM and SIGINT."""

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> torch.Tensor:
        ignored = [signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGTERM, signal.SIGINT)]
        return torch.tensor(ignored)


def test_loader_workers_leave_sigterm_and_ctrl_c_to_the_main_process() -> None:
    loader = DataLoader(Dispositions(), batch_size=2, num_workers=1, worker_init_fn=worker_init(0))
    (batch,) = list(loader)
    assert batch.all(), "a worker would die of the group's SIGTERM/SIGINT before the save"
    assert signal.getsignal(signal.SIGTERM) != signal.SIG_IGN  # the main process still hears it


def test_datamodule_loaders_use_that_worker_start() -> None:
    from fasttrain.data.synthetic import SyntheticDataModule

    data = SyntheticDataModule(num_samples=64, input_shape=[4], num_workers=1)
    data.setup()
    for loader in (data.train_dataloader(), data.val_dataloader(), data.test_dataloader()):
        assert loader.worker_init_fn is not None and loader.worker_init_fn.func.__name__ == (
            "_start_worker"
        )


@pytest.fixture(autouse=True)
def _python_hears_ctrl_c():
    """Python's own SIGINT handler, reinstalled at the C level: a library loaded by an earlier
    test in this process can leave SIGINT's C handler changed while getsignal still reports
    Python's (a raised SIGINT then never reaches it)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def lightning_listening():
    """A SIGTERM handler standing in for Lightning's (it sets trainer.received_sigterm)."""
    heard: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))
    yield heard
    signal.signal(signal.SIGTERM, previous)


def test_ctrl_c_during_fit_becomes_lightnings_sigterm(lightning_listening, caplog) -> None:
    import logging

    said = logging.getLogger("lightning.pytorch.trainer.connectors.signal_connector")
    with ctrl_c_as_sigterm() as taken:
        signal.raise_signal(signal.SIGINT)
        time.sleep(0.01)  # let the Python-level handlers run
        assert taken == [signal.SIGINT] and lightning_listening == [signal.SIGTERM]
        said.info("[rank: 0] Received SIGTERM: 15")  # Lightning's line: not after a Ctrl-C
        assert "Received SIGTERM" not in caplog.text
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C stops at once
            signal.raise_signal(signal.SIGINT)
            time.sleep(0.01)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_ctrl_c_before_lightning_listens_interrupts_as_usual() -> None:
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with ctrl_c_as_sigterm() as taken, pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
            time.sleep(0.01)
        assert taken == []
    finally:
        signal.signal(signal.SIGTERM, previous)


def continue_command(stderr: str, by: str) -> tuple[str, list[str]]:
    """(what the stop line says was saved, the command it gives); exactly one such line."""
    (line,) = [x for x in stderr.splitlines() if x.startswith(f"stopped by {by}")]
    said, command = line.split("; continue with: ")
    return said, shlex.split(command)


def last_step(ckpt: Path) -> int:
    return int(torch.load(ckpt, weights_only=True)["global_step"])


@pytest.mark.slow  # tens of seconds: CI runs it in make test-slow
def test_callbacks_none_sigterm_gives_a_command_that_resumes(tmp_path: Path) -> None:
    # With callbacks=none Lightning's own checkpoint callback saves in the logger's folder: the
    # run folder itself (fasttrain.callbacks.board.RunLogger), so resume=auto finds it there.
    args = ["model=mlp", "callbacks=none", "logger=tensorboard", "data.num_workers=0",
            "trainer.max_epochs=2", "trainer.limit_train_batches=4", "test=false",
            "run_name=N", "+callbacks.killer._target_=killer.Killer",
            "+callbacks.killer.at_step=5", "+callbacks.killer.mode=term"]  # fmt: skip
    proc = train(args, tmp_path, PYTHONPATH=TESTS_DIR)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    said, command = continue_command(proc.stderr, "SIGTERM")
    saved = "logs/train/N/checkpoints/last.ckpt"
    assert said == f"stopped by SIGTERM at step 5: saved {saved}"
    assert "resume=" not in command and "run_name=N" in command
    assert last_step(tmp_path / saved) == 5
    # The command as printed continues from there (the killer is past its step: no new stop).
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                           env=user_env(PYTHONPATH=TESTS_DIR))  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    # (the path as resume=auto found it: absolute)
    assert f"Restored all states from the checkpoint at {tmp_path / saved}" in again.stderr
    # ran on to the end (Lightning's own callback names its checkpoints epoch=..-step=..)
    assert max(last_step(p) for p in (tmp_path / saved).parent.glob("*.ckpt")) == 8


@pytest.mark.slow  # two short runs: CI runs it in make test-slow
@pytest.mark.parametrize(("mode", "at"), [("term_in_save", 2), ("term_in_val", 4)])
def test_sigterm_after_the_batch_end_check_still_saves(mode: str, at: int, tmp_path: Path) -> None:
    # A signal that lands after fasttrain's end-of-batch check (while ModelCheckpoint writes the
    # step, or during validation) stops the run there too: it must still say what holds the step
    # and how to continue, not "nothing saved" (CI once sent its SIGTERM into that window).
    args = ["model=mlp", "data.num_workers=0", "data.batch_size=16", "logger=none", "test=false",
            "trainer.max_epochs=2", "trainer.limit_train_batches=4", "run_name=N",
            "callbacks.checkpoint.every_n_train_steps=2", "callbacks.progress_bar=null",
            "+callbacks.killer._target_=killer.Killer", f"+callbacks.killer.at_step={at}",
            f"+callbacks.killer.mode={mode}"]  # fmt: skip
    if mode == "term_in_val":  # epoch ends only: the step's checkpoint comes after validation
        args[args.index("callbacks.checkpoint.every_n_train_steps=2")] = (
            "callbacks.checkpoint.every_n_train_steps=null"
        )
    proc = train(args, tmp_path, PYTHONPATH=TESTS_DIR)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    said, command = continue_command(proc.stderr, "SIGTERM")
    saved = "logs/train/N/checkpoints/last.ckpt"
    assert said == f"stopped by SIGTERM at step {at}: saved {saved}"
    assert last_step(tmp_path / saved) == at and "resume=" not in command
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                           env=user_env(PYTHONPATH=TESTS_DIR))  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Restored all states from the checkpoint" in again.stderr
    assert last_step(tmp_path / saved) == 8  # ran on to the end


def _default_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def stop_group(sig: signal.Signals, tmp_path: Path) -> tuple[subprocess.CompletedProcess, int]:
    """`python train.py ...` with loader worker processes, `sig` sent to its whole process group
    once it has saved a checkpoint; (the finished process, the step saved before the signal)."""
    args = ["model=mlp", "data.num_workers=2", "data.batch_size=8", "logger=none", "test=false",
            "trainer.max_epochs=2", "callbacks.checkpoint.every_n_train_steps=20",
            "callbacks.progress_bar=null", "run_name=R"]  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args], cwd=tmp_path, env=user_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group, as under a shell or SLURM
        # As started from a terminal: a test run as a background job of a script inherits
        # SIGINT ignored, and a run started so rightly keeps ignoring Ctrl-C.
        preexec_fn=_default_ctrl_c,
    )  # fmt: skip
    last = tmp_path / "logs" / "train" / "R" / "checkpoints" / "last.ckpt"
    wait_for(last.exists, 300, "a checkpoint before the signal", proc, every=0.1)
    before = last_step(last)
    os.killpg(proc.pid, sig)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), before


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "by"), [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")], ids=["term", "int"]
)
def test_signal_to_the_process_group_saves_and_continues(sig, by: str, tmp_path: Path) -> None:
    proc, before = stop_group(sig, tmp_path)
    assert proc.returncode == 128 + sig, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "killed by signal" not in proc.stderr
    # Lightning's "Received SIGTERM: 15" only where a SIGTERM came, not for a Ctrl-C
    assert ("Received SIGTERM" in proc.stderr) == (sig == signal.SIGTERM), proc.stderr[-2000:]
    said, command = continue_command(proc.stderr, by)
    last = tmp_path / "logs" / "train" / "R" / "checkpoints" / "last.ckpt"
    step = last_step(last)
    # (the same step where the signal came while that step's save was ending)
    assert (
        step >= before
        and said == f"stopped by {by} at step {step}: saved {last.relative_to(tmp_path)}"
    )
    assert not any(a.startswith("resume=") for a in command)  # resume=auto finds it there
    again = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                           env=user_env())  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"Restored all states from the checkpoint at {last}" in again.stderr
    assert "`Trainer.fit` stopped: `max_epochs=2` reached." in again.stderr
    assert last_step(last) > step
