"""Failure without hangs: a NaN under the non-finite guard leaves the last good checkpoint
loadable; under trainer=ddp_cpu a rank that raises ends the whole job, non-zero, in bounded time.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from conftest import run_cli

TESTS_DIR = str(Path(__file__).parent)
SMALL = [
    "model=mlp", "data.num_workers=0", "data.batch_size=128", "trainer.max_epochs=2",
    "callbacks.progress_bar=null", "run_name=run",
]  # fmt: skip


def inject(mode: str, at_step: int, rank: int | None = None) -> list[str]:
    return [
        "+callbacks.killer._target_=killer.Killer",
        f"+callbacks.killer.at_step={at_step}",
        f"+callbacks.killer.mode={mode}",
        f"+callbacks.killer.rank={'null' if rank is None else rank}",
    ]


@pytest.mark.slow  # 10-15 s of processes: CI runs it in make test-slow
def test_nan_with_guard_raise_leaves_last_good_checkpoint(tmp_path: Path) -> None:
    # last.ckpt every 3 steps; a NaN gradient at step 7: the guard stops the run before the
    # optimizer applies it, and the newest checkpoint (step 6) holds only finite weights.
    proc = run_cli(
        ["train.py", *SMALL, "callbacks.checkpoint.every_n_train_steps=3",
         "callbacks.nonfinite.action=raise", *inject("nan_grad", at_step=7)],
        tmp_path, PYTHONPATH=TESTS_DIR,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "non-finite gradient at step 7" in proc.stderr
    ckpt = torch.load(tmp_path / "train/run/checkpoints/last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 6
    assert all(torch.isfinite(t).all() for t in ckpt["state_dict"].values())
    # And it is a checkpoint the model loads from (what evaluate and resume do).
    from fasttrain.checkpoints.load import load_task

    model, _ = load_task(tmp_path / "train/run/checkpoints/last.ckpt")
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize(
    "rank",
    [pytest.param(1, marks=pytest.mark.slow), pytest.param(0, marks=pytest.mark.slow)],
    ids=["rank1_raises", "rank0_raises"],
)
def test_ddp_cpu_failing_rank_ends_the_job(rank: int, tmp_path: Path) -> None:
    """One of two DDP processes raises at step 3; the other would wait in its next all-reduce.
    The job (both processes: run_cli waits for every holder of the output pipes) must end
    non-zero well within the timeout."""
    start = time.monotonic()
    proc = run_cli(
        ["train.py", "trainer=ddp_cpu", *SMALL, *inject("raise", at_step=3, rank=rank)],
        tmp_path, timeout=240, PYTHONPATH=TESTS_DIR,
    )  # fmt: skip
    took = time.monotonic() - start
    assert proc.returncode != 0
    assert f"injected failure on rank {rank}" in proc.stderr
    print(f"failing rank {rank}: job ended in {took:.1f} s with code {proc.returncode}")
