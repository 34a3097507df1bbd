"""Resume a run after any crash: which checkpoint, what Lightning does not restore, SIGTERM.

`resume=auto` (default) continues the run in its own folder from its newest checkpoint, if it
has one: a fixed `run_name=NAME` names that folder; with the default timestamped name there is
nothing to resume. `resume=PATH` continues from a given checkpoint; `resume=never` starts over.

Lightning's `fit(ckpt_path=...)` restores weights, optimizer, schedulers, loop position and
callback states. What it leaves out, and where it is handled:
- data order mid-epoch: fasttrain.data.resumable.ResumableLoader (a stateful loader);
- RNG states: `ResumeState` reseeds torch/numpy/random before every training batch from
  (seed, epoch, batch, rank), so the stream a batch sees depends on its position only;
- a kill during a save: fasttrain.checkpoints.io.AtomicCheckpointIO;
- SIGTERM: Lightning stops after the current batch; `ResumeState` saves `last.ckpt` first and
  fasttrain.fit exits 143.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback

from fasttrain.checkpoints.load import read_checkpoint
from fasttrain.config.errors import UserError

LAST = "last.ckpt"


def checkpoint_to_resume(resume: str | None, output_dir: str | Path) -> str | None:
    """The checkpoint a run continues from (None: start fresh); raises UserError on a bad PATH."""
    if resume in (None, "never"):
        return None
    if resume == "auto":
        folder = Path(output_dir) / "checkpoints"
        if os.environ.get("LOCAL_RANK", "0") == "0":  # one process cleans (DDP starts several)
            for stale in folder.glob(".*.tmp"):  # left by a kill during a save; never complete
                stale.unlink(missing_ok=True)
        found = sorted(folder.glob("*.ckpt"), key=lambda p: (p.stat().st_mtime, p.name == LAST))
        return str(found[-1]) if found else None
    path = Path(str(resume)).expanduser()
    if not path.is_file():
        raise UserError(f"resume={resume}: no such file (valid: never, auto or a checkpoint path)")
    return str(path)


def check_fits(ckpt_path: str, model: Any) -> None:
    """Refuse a checkpoint of another model in one line (Lightning would fail deep in fit).

    Loading goes through read_checkpoint: weights_only, so pickled code is refused unexecuted.
    """
    state = read_checkpoint(ckpt_path, expect="resume")["state_dict"]
    own = model.state_dict()
    missing, unexpected = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
    wrong = [k for k in own.keys() & state.keys() if own[k].shape != state[k].shape]
    if missing or unexpected or wrong:
        first = (
            f"shape of {wrong[0]}: {list(state[wrong[0]].shape)} vs {list(own[wrong[0]].shape)}"
            if wrong
            else f"missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
        raise UserError(
            f"resume={ckpt_path}: the checkpoint is of a different model ({first}); "
            "use the model config it was trained with, or resume=never"
        )


class ResumeState(Callback):
    """Position-derived RNG and a checkpoint on SIGTERM (see the module doc)."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.sigterm_checkpoint: str | None = None

    def _reseed(self, trainer: Any, batch_idx: int) -> None:
        import numpy as np
        import torch

        entropy = [abs(self.seed), trainer.current_epoch, batch_idx, trainer.global_rank]
        value = int(np.random.SeedSequence(entropy).generate_state(1)[0])
        torch.manual_seed(value)
        np.random.seed(value)
        random.seed(value)

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        self._reseed(trainer, batch_idx)

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        # Lightning raises SIGTERMException right after this hook; saving here, where
        # ModelCheckpoint saves too, gives a checkpoint Lightning resumes exactly.
        if trainer.received_sigterm and not self.sigterm_checkpoint:
            self.sigterm_checkpoint = _save_last(trainer)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        # With every_n_train_steps, ModelCheckpoint saves no more at epoch ends (Lightning makes
        # the two exclusive): the steps after the last multiple of N would be missing from
        # last.ckpt. Save the final state unless that step is saved already.
        callback = _last_saver(trainer)
        # Private: ModelCheckpoint has no public "step of the last save" (tests/test_internals.py
        # fails if the attribute goes, instead of this silently saving twice).
        if callback is not None and callback._last_global_step_saved != trainer.global_step:
            _save_last(trainer)


def _last_saver(trainer: Any) -> Any:
    """The ModelCheckpoint that keeps the newest state (no monitor), if any."""
    return next((c for c in trainer.checkpoint_callbacks if c.monitor is None), None)


def _save_last(trainer: Any) -> str:
    """Save `<checkpoint dir>/last.ckpt` (where resume=auto looks); return its path."""
    callback = _last_saver(trainer) or trainer.checkpoint_callback
    folder = Path(callback.dirpath) if callback and callback.dirpath else None
    path = str((folder or Path(trainer.default_root_dir) / "checkpoints") / LAST)
    trainer.save_checkpoint(path)
    return path
