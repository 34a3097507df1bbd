"""Resume after a crash: SIGKILL at any step (or mid-save) and resume = the uninterrupted run,
bit for bit; SIGTERM saves first; the resolution of resume=never|auto|PATH."""

from __future__ import annotations

import random
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir

from conftest import CONF, REPO, run_cli, scalar_steps
from fasttrain.checkpoints.resume import checkpoint_to_resume
from fasttrain.config.errors import UserError

# 10 batches per epoch (digits train split / 128), 2 epochs = 20 optimizer steps, last.ckpt every
# 3 steps. Deterministic, one process, no workers; test=false: only the fit is compared.
STEPS = 20
RUN = [
    "model=mlp", "data.num_workers=0", "data.batch_size=128", "trainer.max_epochs=2",
    "trainer.deterministic=true", "trainer.log_every_n_steps=2",
    "callbacks.checkpoint.every_n_train_steps=3", "callbacks.progress_bar=null", "test=false",
    "+trainer.enable_model_summary=false",
]  # fmt: skip
TESTS_DIR = str(Path(__file__).parent)


def train_in_process(log_dir: Path, run_name: str, extra: list[str] = ()) -> Path:
    """The same run as `python train.py ... run_name=<run_name>`, in this process (no start-up)."""
    from fasttrain.tasks import train

    run = log_dir / "train" / run_name
    overrides = [*RUN, *extra, f"paths.root_dir={log_dir}", f"paths.log_dir={log_dir}",
                 f"paths.output_dir={run}"]  # fmt: skip
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        train(compose("train", overrides=[*overrides, f"run_name={run_name}"]))
    return run


def killed(
    log_dir: Path, run_name: str, at_step: int, mode: str = "step", extra: list[str] = ()
) -> subprocess.CompletedProcess:
    """Run in a subprocess that the test-only Killer callback stops at `at_step`."""
    return run_cli(
        [str(REPO / "train.py"), *RUN, *extra, f"run_name={run_name}",
         "+callbacks.killer._target_=killer.Killer", f"+callbacks.killer.at_step={at_step}",
         f"+callbacks.killer.mode={mode}"],
        log_dir, PYTHONPATH=TESTS_DIR,
    )  # fmt: skip


def weights(run: Path) -> dict[str, torch.Tensor]:
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["global_step"] == STEPS
    state = dict(ckpt["state_dict"])
    for i, s in ckpt["optimizer_states"][0]["state"].items():
        state.update({f"optim.{i}.{k}": v for k, v in s.items()})
    return state


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"not bit-identical: {differ}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """Final weights and optimizer state of the uninterrupted run."""
    return weights(train_in_process(tmp_path_factory.mktemp("ref"), "ref"))


def last_step(run: Path) -> int:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]


@pytest.mark.slow  # tens of seconds: CI runs it in make test-slow
def test_sigterm_then_sigkill_then_resume_is_bit_exact(reference, tmp_path: Path) -> None:
    run = tmp_path / "train" / "run"
    # SIGTERM at step 7 (mid-epoch 0): last.ckpt is saved at 7, although the periodic one was 6.
    proc = killed(tmp_path, "run", at_step=7, mode="term", extra=["logger=tensorboard"])
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    assert "stopped by SIGTERM" in proc.stderr and last_step(run) == 7
    # resume=auto (same run_name) continues from 7; SIGKILL at step 14, mid-epoch 1, before its
    # save: the newest checkpoint is step 12, so steps 13-14 are redone.
    proc = killed(tmp_path, "run", at_step=14, extra=["logger=tensorboard"])
    assert proc.returncode == -signal.SIGKILL and last_step(run) == 12
    train_in_process(tmp_path, "run", ["logger=tensorboard"])
    assert_same(weights(run), reference)
    # TensorBoard continued in the same folder with steps continuing: each logged step of the
    # whole run (every 2nd optimizer step, x = steps completed before it) is there, none twice
    # except the redone 12-14.
    steps = scalar_steps(run, "train/loss_step")
    assert sorted(set(steps)) == list(range(0, STEPS, 2))


@pytest.mark.slow
def test_sigkill_at_random_steps_and_mid_save_is_bit_exact(reference, tmp_path: Path) -> None:
    """One run SIGKILLed four times (three random steps, one during a save), resumed each time."""
    rng = random.Random()
    steps = [rng.randint(1, 8), rng.randint(13, 16), rng.randint(17, STEPS - 1)]
    run = tmp_path / "train" / "run"
    for i, step in enumerate(steps):
        assert killed(tmp_path, "run", at_step=step).returncode == -signal.SIGKILL, (steps, i)
        if i == 0:
            # Resume, then die during the save of step 12, after its temp file is written.
            assert killed(tmp_path, "run", at_step=12, mode="save").returncode == -signal.SIGKILL
            assert list((run / "checkpoints").glob(".last.ckpt.*.tmp")), "save not interrupted"
            # The interrupted save left the previous last.ckpt whole and loadable.
            assert last_step(run) == 9
    train_in_process(tmp_path, "run")
    assert_same(weights(run), reference), steps
    assert not list((run / "checkpoints").glob("*.tmp")), "stale temp files were not cleaned"


@pytest.mark.slow
def test_with_loader_workers_mid_epoch_and_at_epoch_end_is_bit_exact(reference, tmp_path):
    """Worker processes draw indices ahead and keep their iterator across epochs: the resumed
    epoch must still skip what was served, and the next one start in full, in its own order."""
    workers = ["data.num_workers=1", "data.persistent_workers=true"]
    run = tmp_path / "train" / "run"
    assert killed(tmp_path, "run", at_step=8, extra=workers).returncode == -signal.SIGKILL
    assert last_step(run) == 6  # mid-epoch 0
    # Now saving at epoch ends only: epoch 0's end (step 10) is the newest at the kill (step 14).
    at_epoch_ends = [*workers, "callbacks.checkpoint.every_n_train_steps=null"]
    assert killed(tmp_path, "run", at_step=14, extra=at_epoch_ends).returncode == -signal.SIGKILL
    assert last_step(run) == 10
    train_in_process(tmp_path, "run", workers)
    assert_same(weights(run), reference)  # the reference ran without workers: same numbers


@pytest.mark.slow
def test_killed_in_an_epoch_end_validation_trains_the_next_epoch_in_full(reference, tmp_path):
    """last.ckpt saved at an epoch's last batch (every 5 steps, 10 an epoch), then SIGKILL in
    that epoch's validation: the resumed run trains all of the next epoch (its loader skipped
    the whole of it, and the run ended at step 10 as if done)."""
    every_5 = ["callbacks.checkpoint.every_n_train_steps=5"]
    run = tmp_path / "train" / "run"
    proc = killed(tmp_path, "run", at_step=10, mode="kill_in_val", extra=every_5)
    assert proc.returncode == -signal.SIGKILL and last_step(run) == 10
    train_in_process(tmp_path, "run", every_5)
    assert_same(weights(run), reference)


@pytest.mark.slow
def test_a_crash_keeps_its_steps_and_resumes_bit_exact(reference, tmp_path: Path) -> None:
    """An exception saves on_exception.ckpt (the newest: resume=auto continues from it), whether
    it hits before a step's forward, in its backward, in validation or after an update; the run
    that ends well removes it."""
    run = tmp_path / "train" / "run"
    crash = run / "checkpoints" / "on_exception.ckpt"

    def step_of(path: Path) -> int:
        return torch.load(path, weights_only=True)["global_step"]

    # Before step 5 (last.ckpt is step 3): the 4 steps done are kept, batch 5 is redone.
    proc = killed(tmp_path, "run", at_step=4, mode="raise_in_step")
    assert proc.returncode == 1 and "injected failure" in proc.stderr
    assert step_of(crash) == 4 and last_step(run) == 3
    assert f"the run failed at step 4 (RuntimeError): saved {crash}" in proc.stderr
    # resume=auto from step 4; a failure in step 8's backward keeps steps 1-7 (last.ckpt: 6).
    proc = killed(tmp_path, "run", at_step=7, mode="raise_in_backward")
    assert proc.returncode == 1 and step_of(crash) == 7 and last_step(run) == 6
    # A failure in epoch 0's validation, after its last step (last.ckpt is step 9).
    proc = killed(tmp_path, "run", at_step=10, mode="raise_in_val")
    assert proc.returncode == 1 and step_of(crash) == 10 and last_step(run) == 9
    # Then a failure after step 14's update (last.ckpt is step 12).
    proc = killed(tmp_path, "run", at_step=14, mode="raise")
    assert proc.returncode == 1 and step_of(crash) == 14 and last_step(run) == 12
    train_in_process(tmp_path, "run")
    assert_same(weights(run), reference)
    assert not crash.exists()  # the finished run's newest state is last.ckpt again


def test_a_crash_saves_only_what_resumes_exactly() -> None:
    from types import SimpleNamespace

    from fasttrain.callbacks.grad_health import NonFiniteGradientError
    from fasttrain.checkpoints.crash import _not_saved_because as why

    net, failed = torch.nn.Linear(2, 2), RuntimeError("a bad batch")

    def _not_saved_because(trainer: Any, net: Any, exception: Exception = failed) -> str | None:
        return why(trainer, net, exception)

    def trainer(step: int, done: int = 0, every: int = 1, saved: int = -1, world: int = 1) -> Any:
        progress = SimpleNamespace(current=SimpleNamespace(completed=done))
        loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress))
        saver = SimpleNamespace(_last_global_step_saved=saved)
        return SimpleNamespace(global_step=step, world_size=world, accumulate_grad_batches=every,
                               fit_loop=loop, checkpoint_callbacks=[saver])  # fmt: skip

    assert _not_saved_because(trainer(7, done=7), net) is None
    assert _not_saved_because(trainer(0), net) == ""  # before the first step: nothing new
    assert _not_saved_because(trainer(6, saved=6), net) == ""  # saved at this step already
    assert "DDP" in _not_saved_because(trainer(7, world=2), net)
    assert "accumulation" in _not_saved_because(trainer(3, done=13, every=4), net)
    assert _not_saved_because(trainer(3, done=12, every=4), net) is None  # a window's start
    # callbacks.nonfinite may raise steps after the bad one: resumed, the run would go past it.
    bad = NonFiniteGradientError("non-finite gradient at step 5")
    assert "non-finite" in _not_saved_because(trainer(7, done=7), net, bad)
    with torch.no_grad():
        net.weight[0, 0] = float("nan")
    assert "NaN" in _not_saved_because(trainer(7, done=7), net)


def test_a_crash_whose_save_fails_still_raises_its_own_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A save that fails in the exception hook (a full disk) is said in one line; it does not
    replace the run's own exception, which Lightning re-raises after the hook."""
    from types import SimpleNamespace

    from fasttrain.checkpoints import crash

    def full_disk(path: str, **_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(crash, "_not_saved_because", lambda *args: None)
    monkeypatch.setattr(crash, "_forget_unfinished_batch", lambda trainer: None)
    trainer = SimpleNamespace(global_step=5, save_checkpoint=full_disk)
    hook = crash.CrashCheckpoint(str(tmp_path))
    with caplog.at_level("WARNING"):
        hook.on_exception(trainer, None, RuntimeError("a bad batch"))  # returns: no OSError
    assert "step 5 (RuntimeError): nothing saved (the save failed: " in caplog.text
    assert "No space left on device" in caplog.text and not list(tmp_path.iterdir())


def test_resume_resolution(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    assert checkpoint_to_resume("auto", tmp_path) is None  # a fresh run: nothing to resume
    ckpts.mkdir()
    (ckpts / ".last.ckpt.1.ab.tmp").write_bytes(b"half")
    assert checkpoint_to_resume("auto", tmp_path) is None
    assert not list(ckpts.glob("*.tmp"))
    (ckpts / "epoch000.ckpt").write_bytes(b"x")
    (ckpts / "last.ckpt").write_bytes(b"x")
    assert checkpoint_to_resume("auto", tmp_path) == str(ckpts / "last.ckpt")
    assert checkpoint_to_resume("never", tmp_path) is None
    assert checkpoint_to_resume(str(ckpts / "epoch000.ckpt"), tmp_path) == str(
        ckpts / "epoch000.ckpt"
    )
    with pytest.raises(UserError, match=r"resume=nope\.ckpt: no such file"):
        checkpoint_to_resume("nope.ckpt", tmp_path)


def test_position_seed_depends_on_every_part_of_the_position() -> None:
    """ResumeState's per-batch seed: a function of (seed, epoch, batch, rank) alone, 32-bit (numpy
    and random take it), and different for every neighbouring position."""
    from fasttrain.data.resumable import position_seed

    grid = [(s, e, b, r) for s in (0, 1, 42) for e in range(4) for b in range(200) for r in (0, 3)]
    seeds = [position_seed(*p) for p in grid]
    assert len(set(seeds)) == len(grid)
    assert all(0 <= v < 2**32 for v in seeds)
    assert position_seed(7, 1, 2, 0) == position_seed(7, 1, 2, 0)
