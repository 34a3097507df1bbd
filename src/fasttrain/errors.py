"""User errors: one clear line, a non-zero exit, and nothing left behind."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# Exit code for bad input, distinct from 1 (a crash) so scripts can tell them apart.
USER_ERROR_EXIT = 2


class UserError(Exception):
    """A mistake in what the user asked for (config, paths, files), not a bug in the code."""


class ConfigError(UserError, ValueError):
    """A constructor argument with an invalid value.

    Components raise it with the argument's own name; the builder that instantiated the component
    prefixes the config path, so the user reads the exact override to fix:
    `data.batch_size=0: expected an int >= 1`.
    """

    def __init__(self, arg: str, value: Any, expected: str) -> None:
        self.arg, self.value, self.expected = arg, value, expected
        super().__init__(f"{arg}={value!r}: {expected}")

    def at(self, path: str) -> UserError:
        return UserError(f"{path}.{self.arg}={self.value!r}: {self.expected}")


def show_tracebacks() -> bool:
    # Same switch Hydra uses, so one variable shows the full trace everywhere.
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def discard_run_dir(output_dir: str | Path, log_dir: str | Path) -> None:
    """Remove what Hydra wrote for a run that never started (its .hydra/ and log file).

    Only files Hydra itself creates are removed, and folders only while they are empty, up to
    (not including) `log_dir`, so a resumed run's checkpoints can never be lost here.
    """
    out, stop = Path(output_dir).resolve(), Path(log_dir).resolve()
    if stop not in out.parents:
        return
    shutil.rmtree(out / ".hydra", ignore_errors=True)
    for log in out.glob("*.log"):
        log.unlink(missing_ok=True)
    folder = out
    while folder != stop:
        try:
            folder.rmdir()  # fails (and stops) at the first non-empty folder
        except OSError:
            break
        folder = folder.parent


def run_task(task: Callable[..., T], *args: Any, run_dirs: tuple[str, str] | None = None) -> T:
    """Run an entry point's task; turn a UserError into one line on stderr and exit code 2.

    `run_dirs` is (output_dir, log_dir) of a Hydra run, discarded when the task fails on input.
    """
    try:
        return task(*args)
    except UserError as err:
        if show_tracebacks():
            raise
        if run_dirs is not None:
            discard_run_dir(*run_dirs)
        print(f"error: {err}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)


def require_ckpt(cfg: Any, entry: str) -> None:
    """The entry points that start from a checkpoint (evaluate, export, predict) need one."""
    from omegaconf import OmegaConf

    if OmegaConf.is_missing(cfg, "ckpt_path") or not cfg.ckpt_path:
        raise UserError(f"ckpt_path is required: python -m fasttrain.{entry} ckpt_path=PATH.ckpt")
