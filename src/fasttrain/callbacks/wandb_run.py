"""`logger=wandb`: WandbRun, Lightning's WandbLogger for one fasttrain run (what it records:
fasttrain.callbacks.trackers). Offline into the run folder by default (`wandb sync` uploads it
later); online, a server that does not answer or a run W&B cannot start is one line before the
run starts, and nothing of the attempt is left."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.loggers.logger import rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from fasttrain.callbacks import trackers
from fasttrain.config.errors import UserError
from fasttrain.config.settings import run_tags

WANDB_ONLINE = "logger.wandb.offline=false"  # the override of conf/logger/wandb.yaml


class WandbRun(WandbLogger, trackers.Tracker):
    """Lightning's WandbLogger for one fasttrain run, offline unless told otherwise.

    Args:
        save_dir: the run folder; W&B writes its `wandb/` folder there.
        project: the W&B project (the package's name; the task is the run's group).
        name: the W&B run's name (default: the run folder's name).
        tags: the run's `tags=`.
        offline: record locally only, no account or network needed (`wandb sync` uploads it).
        kwargs: passed on to `wandb.init` (entity, group, notes, ...).
    """

    def __init__(self, save_dir: str, project: str, name: str, tags: Sequence[str] | str = (),
                 offline: bool = True, **kwargs: Any) -> None:  # fmt: skip
        trackers.require("wandb", "logger=wandb")
        # One id per run folder: a continued run (resume=auto) goes on as the same W&B run.
        run_id = hashlib.sha1(str(Path(save_dir).absolute()).encode()).hexdigest()[:16]
        # An online run that cannot start fails after START_S, not W&B's 90 s.
        bounded = {} if "WANDB_INIT_TIMEOUT" in os.environ else {"init_timeout": trackers.START_S}
        kwargs = {"id": run_id, "resume": "allow", "settings": bounded, **kwargs}
        super().__init__(name=name, save_dir=save_dir, project=project, offline=offline,
                         tags=run_tags(tags), **kwargs)  # fmt: skip
        self._command = ""
        import wandb

        # Lightning's logger would go on writing into a run still open in this process (the
        # previous job of a sweep, one that failed before its end): not this run's.
        if wandb.run is not None and wandb.run.id != run_id:
            wandb.finish()

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The W&B run. Online, a server that does not answer, or a run W&B cannot start (no API
        key), is one line (UserError) and leaves no files of the attempt."""
        if self._experiment is not None or self._offline or _offline_by_env():
            return super().experiment
        import wandb

        _check_wandb_server(wandb.setup().settings.base_url)
        folder = Path(str(self._save_dir)) / "wandb"
        before = set(folder.iterdir()) if folder.is_dir() else set()
        try:
            return super().experiment
        except wandb.Error as err:  # no API key, a refused key, a start timed out
            _remove_new(folder, before)
            raise UserError(
                f"{WANDB_ONLINE}: W&B could not start the run: {trackers.first_line(err)}; "
                f"{_GO_ONLINE}"
            ) from None

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """Lightning's own call (the module's constructor arguments): see `record_start`."""

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        super().log_metrics(trackers.without_epoch(metrics), step)

    @rank_zero_only
    def record_start(self, hparams: Mapping[str, Any]) -> None:
        self.experiment.config.update(dict(hparams), allow_val_change=True)

    @rank_zero_only
    def record_end(self, final: Mapping[str, float], step: int, checkpoint: str | None) -> None:
        """The last record of the run; the run is then finished (written out whole, and not
        reused by a later run in this process)."""
        self.log_metrics({f"final/{k}": float(v) for k, v in final.items()}, step)
        run = self.experiment
        if checkpoint:
            run.summary["checkpoint"] = str(Path(checkpoint).absolute())
        if self._offline:
            self._command = (
                f"{trackers.executable('wandb')} sync {shlex.quote(str(Path(run.dir).parent))}"
            )
        else:
            self._command = str(getattr(run, "url", "") or "")
        run.finish()

    def show_command(self) -> str:
        """What uploads (offline) or shows (online) the run, once `record_end` has run."""
        return self._command

    def shown_commands(self) -> dict[str, str]:
        return {"W&B": self._command} if self._command else {}


_GO_ONLINE = ("set WANDB_API_KEY (or run `wandb login`) for a server that answers, or keep "
              "logger.wandb.offline=true and `wandb sync` the run folder later")  # fmt: skip


def _offline_by_env() -> bool:
    """WANDB_MODE=offline (or disabled) wins over offline=false in wandb.init: nothing to reach."""
    return os.environ.get("WANDB_MODE", "") in ("offline", "dryrun", "disabled")


def _check_wandb_server(base_url: str) -> None:
    # wandb.init retries an unreachable server until its init timeout, then fails with a
    # traceback and a half-made run folder: a quick probe refuses it first, and writes nothing.
    if not trackers.answers(base_url, trackers.REACH_S):
        raise UserError(f"{WANDB_ONLINE}: no W&B server answered at {base_url} within "
                        f"{trackers.REACH_S} s; {_GO_ONLINE}")  # fmt: skip


def _remove_new(folder: Path, before: set[Path]) -> None:
    """What a failed wandb.init wrote into `folder` (the run's files, its logs), and the folder
    itself where it made it."""
    import shutil

    if not folder.is_dir():
        return
    for path in set(folder.iterdir()) - before:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if not before:
        with contextlib.suppress(OSError):
            folder.rmdir()
