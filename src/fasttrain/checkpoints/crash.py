"""`CrashCheckpoint`: the state of a run that fails with an exception, saved where resume=auto
looks, when it resumes exactly. Without it a crash at step 900 of a 1,000-step epoch loses the
900 steps: `last.ckpt` is saved at epoch ends by default (`callbacks.checkpoint`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.callbacks import Checkpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

from fasttrain.config.errors import UserError
from fasttrain.config.project import shown

log = logging.getLogger(__name__)


class CrashCheckpoint(Checkpoint):
    """Lightning's OnExceptionCheckpoint (`<dirpath>/on_exception.ckpt`, the newest checkpoint
    of the folder, so resume=auto continues from it; removed once a newer one is saved),
    saved only when there is something new to keep that resumes exactly, said in one line.

    Not saved: for SIGTERM and Ctrl-C (ResumeState saves last.ckpt after the batch); for a
    setting refused mid-run (a UserError, Lightning's MisconfigurationException: the command
    line is what to fix, and the refused run's folder is taken back); for a
    non-finite value (FloatingPointError: callbacks.nonfinite's NonFiniteGradientError, which
    may stop a few steps after the bad one, and promises no checkpoint from it on; resumed, the
    run would go on past it); before the first step, or at a step already saved; in a gradient
    accumulation window (its summed gradients are not in a checkpoint: the resumed window would
    be short); with NaN/Inf in the weights (a state not worth continuing); under DDP (the save
    waits for every rank, and only this one failed). Lightning's loops count where the failure
    hit: a failure in a step's forward or backward resumes at that batch, one after its update
    (a callback's end-of-batch hook) at the next.

    Not a subclass of Lightning's: with an OnExceptionCheckpoint among the callbacks, Lightning
    turns `fit(ckpt_path=None)` into `ckpt_path="last"` (a run started fresh, resume=never,
    would continue from whatever checkpoint its folder holds).

    Args:
        dirpath: the run's checkpoint folder.
    """

    def __init__(self, dirpath: str) -> None:
        super().__init__()
        self.dirpath = dirpath

    @property
    def ckpt_path(self) -> str:
        return str(Path(self.dirpath) / "on_exception.ckpt")

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if isinstance(exception, (SIGTERMException, KeyboardInterrupt)):
            return
        reason = _not_saved_because(trainer, pl_module, exception)
        step, failed = trainer.global_step, type(exception).__name__
        if reason is None:
            _forget_unfinished_batch(trainer)
            try:
                trainer.save_checkpoint(self.ckpt_path, weights_only=False)  # None: an info line
            except Exception as error:  # a full disk, say: the run's own failure is the news
                log.warning("the run failed at step %d (%s): nothing saved (the save failed: %s); "
                            "%s", step, failed, error, _continue(None))  # fmt: skip
                return
            # the command, not "resume=auto": a sweep job's folder is found by no run_name
            log.warning("the run failed at step %d (%s): saved %s; %s", step, failed,
                        shown(self.ckpt_path), _continue(self.ckpt_path))  # fmt: skip
        elif reason:
            log.warning("the run failed at step %d (%s): nothing saved (%s)", step, failed, reason)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # Not after every stage, as Lightning's OnExceptionCheckpoint does: a tuner's fit
        # (tuner.lr_find) ends before the real fit, which then resumes from this very file. Only
        # a newer checkpoint of the run supersedes it. (The finiteness check in
        # _not_saved_because syncs the device, on the exception path only.)
        path = Path(self.ckpt_path)
        if path.is_file() and any(other.stat().st_mtime > path.stat().st_mtime
                                  for other in path.parent.glob("*.ckpt")):  # fmt: skip
            trainer.strategy.remove_checkpoint(self.ckpt_path)


def _continue(saved: str | None) -> str:
    from fasttrain.checkpoints.resume import how_to_continue

    try:
        return how_to_continue(saved)
    except Exception as error:  # the failure is the news, not the hint
        return f"(no command to continue: {error})"


def _forget_unfinished_batch(trainer: Any) -> None:
    """A batch fetched whose step failed (in its forward, say) is one the resumed run trains:
    the loop's counts and the training loader's go back to before it was fetched, so the save
    is one Lightning resumes as a save after the previous batch (a count left over shifts the
    logged steps and what the resumed epoch serves)."""
    from fasttrain.data.resumable import ResumableLoader

    progress = trainer.fit_loop.epoch_loop.batch_progress
    unfinished = progress.current.ready - progress.current.processed
    if unfinished <= 0:
        return
    for counts in (progress.total, progress.current):
        counts.ready = counts.started = counts.processed
    loader = trainer.train_dataloader
    if isinstance(loader, ResumableLoader):
        loader.unserve(unfinished)


def _not_saved_because(trainer: Any, pl_module: Any, exception: BaseException) -> str | None:
    """Why the failed run's state is not saved ("" unsaid: nothing new), or None: save it."""
    if isinstance(exception, FloatingPointError):
        return "a non-finite value; the newest checkpoint holds the last finite weights"
    if isinstance(exception, (UserError, MisconfigurationException)):
        return ""  # a setting refused once the run saw it (a monitor never logged): its one line
    step = trainer.global_step
    saved = [getattr(c, "_last_global_step_saved", -1) for c in trainer.checkpoint_callbacks]
    if step == 0 or step in saved:
        return ""
    if trainer.world_size > 1:
        return "under DDP a save waits for every rank; the newest checkpoint stays"
    every = trainer.accumulate_grad_batches
    done = trainer.fit_loop.epoch_loop.batch_progress.current.completed
    if every > 1 and done % every:
        return "mid gradient accumulation window; the newest checkpoint stays"
    with torch.no_grad():
        finite = all(bool(torch.isfinite(p).all()) for p in pl_module.parameters())
    return None if finite else "the weights hold NaN or Inf; the newest checkpoint stays"
