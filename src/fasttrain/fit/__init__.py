"""Everything around `trainer.fit`: run-level knobs, resume, SIGTERM/Ctrl-C and the out-of-memory
retry. fasttrain.tasks.train calls `set_matmul_precision`, the tuner where one is set
(fasttrain.tasks.tuner) and `fit`, in that order.

`oom_fallback=true`: on CUDA out-of-memory during fit, halve the micro-batch, double gradient
accumulation (the effective batch, and so the optimisation, stays the same) and fit again from
the weights in memory, at the epoch that failed. Below batch size 1 there is nothing left to
halve and it gives up, with torch.cuda.memory_summary() in the message. One process only: under
DDP a rank that shrinks its batch alone would fall out of step with the others.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from fasttrain.checkpoints.resume import how_to_continue
from fasttrain.checkpoints.state import ResumeState
from fasttrain.config.project import shown

log = logging.getLogger(__name__)


def set_matmul_precision(value: str | None) -> None:
    """float32 matmuls: "highest" exact fp32; "high" TF32 on Tensor Cores (~8x the fp32 rate on
    Ampere+, 10-bit mantissa); "medium" bf16 internally. Null keeps torch's default. The value
    was checked with the config (fasttrain.config.settings)."""
    if value is not None:
        torch.set_float32_matmul_precision(value)


def fit_once(trainer: Any, model: L.LightningModule, datamodule: Any,
             ckpt_path: str | None) -> None:  # fmt: skip
    """trainer.fit from `ckpt_path`. SIGTERM or Ctrl-C: last.ckpt after the current batch, then
    exit 143 (130) with the command that continues the run."""
    if ckpt_path:  # checked (and read) once: the command-line check did it for this model
        from fasttrain.checkpoints.fits import check_fits, written_with_averaging

        check_fits(ckpt_path, model, trainer.max_epochs, data=datamodule)
        _say_if_averaging_is_dropped(trainer, ckpt_path, written_with_averaging(
            ckpt_path, model, datamodule))  # fmt: skip
    try:
        with ctrl_c_as_sigterm() as ctrl_c:
            # weights_only: resuming never unpickles code from a checkpoint file.
            trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)
    except SIGTERMException:
        signum = signal.SIGINT if ctrl_c else signal.SIGTERM
        state = next((c for c in trainer.callbacks if isinstance(c, ResumeState)), None)
        saved = state.save_on_stop(trainer) if state else None
        log.warning(stopped(signum, trainer.global_step, saved))  # console and the run's log
        sys.exit(128 + signum)


def stopped(signum: int, step: int, saved: str | None) -> str:
    """One line: what stopped the run, what was saved, how to continue."""
    by = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM"
    what = f"saved {shown(saved)}" if saved else "nothing saved"
    return f"stopped by {by} at step {step}: {what}; {how_to_continue(saved)}"


@contextlib.contextmanager
def ctrl_c_as_sigterm() -> Iterator[list[int]]:
    """During fit, Ctrl-C (SIGINT) does what SIGTERM does: Lightning finishes the current batch,
    ResumeState saves last.ckpt, fit_once exits. Lightning's own Ctrl-C handling
    (KeyboardInterrupt) saves nothing. A second Ctrl-C, or one before Lightning listens for
    SIGTERM, interrupts at once. The list yields the SIGINTs taken over."""
    taken: list[int] = []
    # Handlers can only be set from the main thread; a process started with SIGINT ignored
    # (nohup, a background job of a script) keeps ignoring it.
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield taken
        return

    def on_ctrl_c(signum: int, frame: Any) -> None:
        if taken or signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, signal.SIG_IGN, None):
            raise KeyboardInterrupt
        taken.append(signum)
        print("Ctrl-C: stopping after this batch and saving last.ckpt (Ctrl-C again: stop now, "
              "unsaved)", file=sys.stderr)  # fmt: skip
        signal.raise_signal(signal.SIGTERM)  # Lightning's handler (trainer.received_sigterm)

    def not_after_ctrl_c(record: logging.LogRecord) -> bool:
        # Lightning says "Received SIGTERM: 15" for the SIGTERM that stands in for the Ctrl-C.
        return not (taken and "Received SIGTERM" in record.getMessage())  # "[rank: 0] Rec..."

    lightning_log = logging.getLogger("lightning.pytorch.trainer.connectors.signal_connector")
    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    lightning_log.addFilter(not_after_ctrl_c)
    try:
        yield taken
    finally:
        signal.signal(signal.SIGINT, previous)
        lightning_log.removeFilter(not_after_ctrl_c)


def _say_if_averaging_is_dropped(trainer: L.Trainer, ckpt_path: str, averaged: bool) -> None:
    """A checkpoint written with weight averaging holds the average as its weights (and the
    raw ones aside): resumed without the averaging callback, training goes on from the average."""
    from lightning.pytorch.callbacks import WeightAveraging

    callbacks = trainer.callbacks  # type: ignore[attr-defined]
    if averaged and not any(isinstance(c, WeightAveraging) for c in callbacks):
        log.warning(
            f"resume: {ckpt_path} was written with weight averaging (callbacks/averaging=ema or "
            "swa) and this run has none: training goes on from the averaged weights, the raw "
            "ones are dropped; resume with the same callbacks/averaging to keep both"
        )


FitOnce = Callable[[L.Trainer, L.LightningModule, Any, "str | None"], None]


def fit(
    trainer: L.Trainer,
    model: L.LightningModule,
    datamodule: Any,
    ckpt_path: str | None = None,
    oom_fallback: bool = False,
    fit_once: FitOnce = fit_once,
) -> None:
    """`fit_once(trainer, model, datamodule, ckpt_path)`, retried smaller on OOM when asked."""
    while True:
        try:
            fit_once(trainer, model, datamodule, ckpt_path)
            return
        except torch.OutOfMemoryError as err:
            if not oom_fallback:
                raise
            reason = str(err).splitlines()[0] if str(err) else "CUDA out of memory"
        from fasttrain.fit.oom import shrink_batch  # only after an out-of-memory error

        shrink_batch(trainer, datamodule, reason)
        ckpt_path = None  # go on from the weights in memory, not back to the checkpoint
