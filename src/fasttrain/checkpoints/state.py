"""What a resumed run needs while it trains: `ResumeState` (RNG derived from the position, so
a batch's random stream depends on where it is only; `last.ckpt` on SIGTERM; a validation at
the step trainer.max_steps ends a run on) and `confine_restored_paths` (a checkpoint's
ModelCheckpoint state may name only files inside the run's checkpoint folder). Which checkpoint
a run continues from: fasttrain.checkpoints.resume; whether it fits: fasttrain.checkpoints.fits."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from fasttrain.checkpoints.resume import LAST
from fasttrain.data.resumable import position_seed

log = logging.getLogger(__name__)


# ModelCheckpoint state entries that name files: Lightning reads them back on resume and later
# deletes "old" checkpoints among them (its check that a path lies under `dirpath` does not
# collapse `..` or follow symlinks).
PATH_KEYS = ("best_model_path", "kth_best_model_path", "last_model_path")


def confine_restored_paths(callback: ModelCheckpoint) -> None:
    """Make `callback` restore only the paths of its state that resolve inside its own folder.

    A checkpoint is input like any other: a crafted (or copied) `last.ckpt` whose ModelCheckpoint
    state names `<dirpath>/../../victim.txt` would have that file deleted as an "old" checkpoint,
    or read as the best one. Each such path is dropped, said in one line, when the state is
    loaded (before any training step); set on the instance, so a subclass keeps its own method.
    """
    restore = callback.load_state_dict

    def load_state_dict(state_dict: dict[str, Any]) -> None:
        restore(_confined(state_dict, callback.dirpath))

    callback.load_state_dict = load_state_dict  # type: ignore[method-assign]


def _confined(state: dict[str, Any], dirpath: str | Path | None) -> dict[str, Any]:
    root = Path(dirpath).resolve() if dirpath else None

    def inside(path: Any) -> bool:
        return root is not None and Path(str(path)).resolve().is_relative_to(root)

    kept, dropped = dict(state), []
    for key in PATH_KEYS:
        if state.get(key) and not inside(state[key]):
            dropped.append(str(state[key]))
            kept[key] = ""
    best_k = state.get("best_k_models")
    best_k = dict(best_k) if isinstance(best_k, dict) else {}
    dropped += [str(p) for p in best_k if not inside(p)]
    kept["best_k_models"] = {p: v for p, v in best_k.items() if inside(p)}
    if dropped:
        log.warning(
            f"resume: the checkpoint's ModelCheckpoint state names {len(dropped)} file(s) outside "
            f"this run's checkpoint folder {dirpath} (first: {dropped[0]}); dropped, never read "
            "or deleted"
        )
    return kept


class ResumeState(Callback):
    """Position-derived RNG, a checkpoint on SIGTERM (see the module doc), and a validation at
    the step trainer.max_steps ends a run on."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.sigterm_checkpoint: str | None = None

    def _reseed(self, trainer: Any, batch_idx: int) -> None:
        import numpy as np
        import torch

        value = position_seed(self.seed, trainer.current_epoch, batch_idx, trainer.global_rank)
        if torch.cuda.is_initialized():
            torch.manual_seed(value)  # the CPU's and every GPU's generator
        else:
            # Before CUDA starts (a CPU run), torch.manual_seed queues the GPUs' seeding with a
            # captured stack trace, ~0.2 ms a step: seed the CPU's generator alone (~2 us).
            torch.default_generator.manual_seed(value)
            if torch.backends.mps.is_available():
                torch.mps.manual_seed(value)
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
        # A run that trainer.max_steps ends mid-epoch: Lightning validates only at an epoch's end
        # (or a val_check_interval), so it would end with no val metrics and no best checkpoint.
        # A stop asked for at the last step is validated first, as an early stop is; min_epochs
        # and min_steps, which would hold that stop back, mean nothing once max_steps is reached.
        # Here, not in a callback of its own: no extra hook call on every step.
        if 0 < trainer.max_steps <= trainer.global_step:
            trainer.fit_loop.min_epochs = trainer.fit_loop.epoch_loop.min_steps = None
            trainer.should_stop = True

    def save_on_stop(self, trainer: Any) -> str | None:
        """The checkpoint of a run stopped by SIGTERM/Ctrl-C, wherever Lightning stopped it.

        Mostly saved by on_train_batch_end above. A signal that comes after that hook (while
        ModelCheckpoint saves the same step, or during validation) stops the run with nothing
        saved by it: the step's last.ckpt then is ModelCheckpoint's, if it saved this step, or
        is saved now. Lightning resumes either exactly (its loops count a save after the batch's
        end as such). Under DDP a rank stopped alone would wait for the others in a save: there
        only the checkpoint of the hook counts.
        """
        if self.sigterm_checkpoint:
            return self.sigterm_checkpoint
        callback = _last_saver(trainer)
        # Without a monitor, a ModelCheckpoint's "best" is the file it saved last.
        newest = callback.best_model_path if callback is not None else ""
        at_this_step = newest and callback._last_global_step_saved == trainer.global_step
        if at_this_step and Path(newest).is_file():
            return str(newest)
        if trainer.world_size == 1:
            self.sigterm_checkpoint = _save_last(trainer)
        return self.sigterm_checkpoint

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
    return next((c for c in trainer.checkpoint_callbacks
                 if isinstance(c, ModelCheckpoint) and c.monitor is None), None)  # fmt: skip


def _save_last(trainer: Any) -> str:
    """Save `<checkpoint dir>/last.ckpt` (where resume=auto looks); return its path."""
    callback = _last_saver(trainer) or trainer.checkpoint_callback
    folder = Path(callback.dirpath) if callback and callback.dirpath else None
    path = str((folder or Path(trainer.default_root_dir) / "checkpoints") / LAST)
    trainer.save_checkpoint(path, weights_only=False)  # the whole state: a resumable checkpoint
    return path
