"""Resume a run after any crash: which checkpoint, what Lightning does not restore, SIGTERM.

`resume=auto` (default) continues the run in its own folder from its newest checkpoint, if it
has one: a fixed `run_name=NAME` names that folder; with the default timestamped name there is
nothing to resume. `resume=PATH` continues from a given checkpoint; `resume=never` starts over.

Lightning's `fit(ckpt_path=...)` restores weights, optimizer, schedulers, loop position and
callback states. What it leaves out, and where it is handled:
- data order mid-epoch: fasttrain.data.resumable.ResumableLoader (a stateful loader);
- RNG states: `ResumeState` (fasttrain.checkpoints.state) reseeds torch/numpy/random before
  every training batch from (seed, epoch, batch, rank), so the stream a batch sees depends on
  its position only;
- a kill during a save: fasttrain.checkpoints.io.AtomicCheckpointIO;
- SIGTERM (and Ctrl-C, which fasttrain.fit turns into one): Lightning stops after the current
  batch; `ResumeState` saves `last.ckpt` first and fasttrain.fit exits 143 (130), printing the
  command that continues the run (`how_to_continue`).

Whether the checkpoint found fits this run (the same model, data split, recipe): `check_fits`
(fasttrain.checkpoints.fits), loaded only when there is one.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from fasttrain.config.errors import UserError
from fasttrain.config.project import shown

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


def how_to_continue(saved: str | None) -> str:
    """The command that continues this run, said truly: the same overrides in the same run
    folder, with `resume=PATH` added only where resume=auto would not find `saved` there."""
    import shlex
    import sys

    from hydra.core.hydra_config import HydraConfig

    from fasttrain.config.overrides import quote

    if not HydraConfig.initialized():  # called outside an entry point (tests, notebooks)
        return f"continue with resume={shown(saved)}" if saved else "no checkpoint saved"
    hc = HydraConfig.get()
    out = str(hc.runtime.output_dir)
    args = [o for o in hc.overrides.task if not o.startswith(("resume=", "hydra.run.dir="))]
    if str(hc.mode).endswith("MULTIRUN"):  # the one job of the sweep, again in its folder
        args += ["hydra.mode=RUN", f"hydra.run.dir={quote(shown(out))}"]
    else:
        hydra = {o.split("=", 1)[0]: o for o in hc.overrides.hydra}  # the last of each key
        dropped = ("hydra.mode", "hydra.job.", "hydra.output_", "hydra.run.dir")
        args += [o for k, o in hydra.items() if not k.startswith(dropped)]
        if "hydra.run.dir" in hydra:  # the folder fasttrain.cli pinned (or one given)
            args.append(f"hydra.run.dir={quote(shown(out))}")
    found = checkpoint_to_resume("auto", out)
    if saved and (found is None or not Path(found).samefile(saved)):
        args.append(f"resume={quote(shown(saved))}")
    command = shlex.join([shown(sys.executable), shown(sys.argv[0]), *args])
    if saved:
        return f"continue with: {command}"
    if found:
        return f"the newest checkpoint is {shown(found)}; continue from it with: {command}"
    return f"no checkpoint to continue from; start over with: {command}"


def disk_full(err: OSError) -> str:
    """One line for a full disk (or quota), whose traceback would say nothing more: where, what
    to do, and for a training run the command that continues it (its newest complete checkpoint
    stays: saves are atomic)."""
    from hydra.core.hydra_config import HydraConfig

    where = f" writing {shown(err.filename)}" if err.filename else ""
    line = (f"the disk is full{where} ({err.strerror}): free some space, or set paths.log_dir "
            "to a disk with room")  # fmt: skip
    if HydraConfig.initialized() and HydraConfig.get().job.config_name == "train":
        with contextlib.suppress(Exception):
            line += f"; then {how_to_continue(None)}"
    return line
