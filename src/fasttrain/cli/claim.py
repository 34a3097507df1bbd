"""A single run's hold on its run folder before Hydra writes into it (`claim_run_dir`): a lock
a second run with the same run_name respects, the checks that could refuse to resume it, and,
with resume=never, the old run moved aside; a run refused later takes back what it wrote."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from pathlib import Path
from typing import Any

from fasttrain.cli.build import construct
from fasttrain.config.errors import UserError
from fasttrain.config.project import shown

# In each run folder: held (flock) by the run writing there, so a second one refuses to start.
LOCK_FILE = ".run.lock"


class RunClaim:
    """This invocation's hold on its run folder, taken before Hydra writes into it.

    A lock other runs respect (flock: the kernel drops it when the process ends, however it
    ends, so a killed run never leaves the folder locked), and a record of what the folder held,
    so that a run failing on bad input takes back exactly what it wrote and nothing else:
    new files and folders are removed, the config files Hydra rewrote get their old bytes back,
    a log that existed is cut back to its old length.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._record()
        self.fd: int | None = None
        self.moved: tuple[Path, Path] | None = None  # (run folder, where its old run went)

    def _record(self) -> None:
        out = self.run_dir
        self.existed = next(p for p in (out, *out.parents) if p.exists())
        self.before = {p.relative_to(out) for p in out.rglob("*")} if out.is_dir() else set()
        rewritten = [*out.glob(".hydra/*"), out / LOCK_FILE]  # Hydra's config; the lock's pid
        self.saved = {p: p.read_bytes() for p in rewritten if p.is_file()}
        self.log_sizes = {p: p.stat().st_size for p in out.glob("*.log") if p.is_file()}

    def lock(self, named: str) -> None:
        """`named`: the override that names the folder (run_name=R), said when refused."""
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # read-only, no permission, /proc...: one line, not a traceback
            if err.errno in (errno.ENOSPC, errno.EDQUOT):  # a full disk: fasttrain.cli says so
                raise
            raise UserError(f"{named}: cannot make the run folder {shown(self.run_dir)} "
                            f"({err.strerror}); choose another") from None  # fmt: skip
        self.fd = _lock(self.run_dir, named)

    def move_aside(self, named: str) -> None:
        """resume=never where a run already is: keep that run, renamed, and start empty."""
        if not any(p.name != LOCK_FILE for p in self.run_dir.iterdir()):
            return
        stamp = time.strftime("%m%d-%H%M%S")  # as in a run's default name
        aside = self.run_dir.with_name(f"{self.run_dir.name}.replaced-{stamp}")
        for n in range(1, 1000):
            if not aside.exists():
                break
            aside = aside.with_name(f"{self.run_dir.name}.replaced-{stamp}-{n}")
        old_lock = self.fd
        os.rename(self.run_dir, aside)  # its lock file goes along, still held until the new one
        self.moved = (self.run_dir, aside)
        self._record()
        self.lock(named)
        if old_lock is not None:
            os.close(old_lock)

    def undo(self) -> None:
        out = self.run_dir
        _close_logs_in(out)
        for path in sorted(out.rglob("*"), reverse=True) if out.is_dir() else []:
            if path.relative_to(out) in self.before:
                continue
            if path.is_dir() and not path.is_symlink():
                with contextlib.suppress(OSError):
                    path.rmdir()  # only when empty: a new folder with old files stays
            else:
                path.unlink(missing_ok=True)
        for path, data in self.saved.items():
            path.write_bytes(data)
        for path, size in self.log_sizes.items():
            with contextlib.suppress(OSError):
                os.truncate(path, size)
        for folder in (out, *out.parents):
            if folder == self.existed or not folder.is_relative_to(self.existed):
                break
            with contextlib.suppress(OSError):
                folder.rmdir()
        if self.moved is not None and not self.moved[0].exists():
            os.rename(self.moved[1], self.moved[0])
            self.moved = None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def _close_logs_in(folder: Path) -> None:
    """Detach and close the log handlers writing into `folder` before its files go (Hydra put
    the run's log on the root logger): a later run in this process (a notebook, a test) would
    otherwise log into a deleted file and fail."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in (lg for lg in loggers if isinstance(lg, logging.Logger)):
        for handler in list(logger.handlers):
            if isinstance(handler, logging.FileHandler) and Path(
                handler.baseFilename
            ).is_relative_to(folder):
                logger.removeHandler(handler)
                handler.close()


def _lock(run_dir: Path, named: str) -> int | None:
    try:
        import fcntl
    except ImportError:  # Windows: no flock; runs there are not protected from each other
        return None
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        owner = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise UserError(
            f"{named}: another run (pid {owner}) is writing to {shown(run_dir)}; "
            f"wait for it to end, or choose another {named.partition('=')[0]}"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def claim_run_dir(job: Any, run_dir: Path, built: Any = None) -> RunClaim:
    """Lock the run folder, then make every check that could refuse to resume (readable
    checkpoint, same model, not past trainer.max_epochs) or, with resume=never, move the old run
    aside: all before Hydra writes its config into the folder. `built`: the run's (trainer,
    model, data module), which the checkpoint is checked against."""
    claim = RunClaim(run_dir)
    named = _folder_named_by(job)
    claim.lock(named)  # refused: the folder is another run's, nothing to undo
    try:
        if job.get("resume") == "never":
            claim.move_aside(named)
        elif job.get("resume") is not None:
            check_resume(job, run_dir, built)
    except BaseException:
        claim.undo()
        claim.release()
        raise
    return claim


def _folder_named_by(job: Any) -> str:
    """The override that names the run's folder: run_name=R, or paths.output_dir=DIR where one
    was given (fasttrain.config.overrides pins Hydra's folder to it)."""
    from omegaconf import OmegaConf

    given = OmegaConf.select(job, "paths.output_dir", throw_on_resolution_failure=False)
    raw = OmegaConf.to_container(job.paths, resolve=False) if "paths" in job else {}
    if isinstance(raw, dict) and "${hydra:" not in str(raw.get("output_dir", "${hydra:")):
        return f"paths.output_dir={given}"
    return f"run_name={job.get('run_name')}"


def check_resume(job: Any, run_dir: Path, built: Any = None) -> None:
    """Read and check the checkpoint the run would continue from, once: fit finds the result
    (fasttrain.checkpoints.fits.check_fits) for the same model, data module and file."""
    from fasttrain.checkpoints.resume import checkpoint_to_resume

    ckpt = checkpoint_to_resume(job.resume, run_dir)
    if ckpt is not None:
        from fasttrain.checkpoints.fits import check_fits

        max_epochs = job.trainer.get("max_epochs")
        _, model, datamodule = built if built is not None else (None, *construct(job))
        check_fits(ckpt, model, max_epochs, resume=str(job.resume), data=datamodule)
