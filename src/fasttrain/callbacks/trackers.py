"""MLflow and Weights & Biases, one override each (`logger=mlflow`, `logger=wandb`; several at
once: `logger=many`, or `logger=[tensorboard,mlflow]`), recording what TensorBoard's HPARAMS
session records (fasttrain.callbacks.board): the run's chosen hyperparameters (not the whole
config), its `tags=`, the final val/test and performance values and the path of the best
checkpoint. Every scalar keeps the one step convention of fasttrain.callbacks.board (x = optimizer
steps completed), without Lightning's `epoch` scalar.

MLflow's pages are its own, so the run records what they show well: the experiment is marked as
model training (EXPERIMENT_KIND), not GenAI; the final values are the latest values of the metrics
themselves (the runs table's and the run page's numbers), not `final/*` metrics, each a chart of
one point heading the run page, and the run's Description tables them (NOTE_TAG); the composed
config and the performance summary are artifacts; `view_url` opens the experiment on its runs.

Both stay on this machine by default: MLflow writes a SQLite tracking database under `logs/`
(`mlflow ui --backend-store-uri ...` shows it, the command printed at the end of a run); W&B runs
offline into the run folder (`wandb sync <folder>` uploads it later, also printed). A run
continued in its folder (resume=auto) continues the same MLflow run (its id is kept in the run
folder, RUN_ID_FILE) and W&B run id.

A tracker on the network (an MLflow server, W&B online) that does not answer is one line before
the run starts, after a bounded wait (REACH_S, START_S), instead of minutes of the clients'
retries; nothing is left of the attempt.

The loggers: fasttrain.callbacks.mlflow_run.MLflowRun, fasttrain.callbacks.wandb_run.WandbRun;
here what they share and what the train task calls on them (Tracker; fasttrain.tasks).
"""

from __future__ import annotations

import importlib.util
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fasttrain.config.errors import UserError

# Seconds a server gets to answer one request before the run starts (MLflow's client retries 7
# times with backoff by default: minutes), and W&B to start an online run (its default is 90).
REACH_S = 10
START_S = 30


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def require(module: str, override: str) -> None:
    """One line naming the extra to install, instead of Lightning's ModuleNotFoundError."""
    if not installed(module):
        raise UserError(f"{override} needs the {module} package: pip install -e '.[{module}]' "
                        f"(make install includes it), or choose another logger")  # fmt: skip


def without_epoch(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if k != "epoch"}


def executable(name: str) -> str:
    """The tool of this very environment (a bare name is found only with the venv activated)."""
    exe = Path(sys.executable).parent / name
    try:
        return str(exe.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(exe)


def first_line(err: Exception, limit: int = 200) -> str:
    lines = str(err).strip().splitlines() or [type(err).__name__]
    return lines[0][:limit].rstrip(". ")


def answers(url: str, timeout: float) -> bool:
    """Whether anything answers HTTP at `url` within `timeout` seconds. An error status or a
    TLS failure is an answer: the client then says what is wrong itself."""
    try:
        urllib.request.urlopen(url, timeout=timeout).close()
    except urllib.error.HTTPError:
        return True
    except urllib.error.URLError as err:
        return isinstance(err.reason, ssl.SSLError)
    except OSError:  # timed out reading, or the connection reset
        return False
    return True


class Tracker:
    """What the train task asks of a tracker's logger (MLflowRun, WandbRun inherit it). A base
    class, not a Protocol: fast_dev_run's DummyLogger answers every attribute with a no-op."""

    def record_start(self, hparams: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def record_end(self, final: Mapping[str, float], step: int, checkpoint: str | None) -> None:
        raise NotImplementedError

    def shown_commands(self) -> dict[str, str]:
        raise NotImplementedError
