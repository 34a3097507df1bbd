"""Checkpoint files that are either the old one or the new one, never half of each.

Lightning's TorchCheckpointIO writes through an fsspec transaction, which stages a local file in
the system temp dir and moves it into place on commit; across file systems that move is a copy
over the old file, and nothing is fsync'ed, so a kill or power loss mid-save can leave a
truncated `last.ckpt` and nothing to resume from. Here the new bytes go to a temp file in the
same directory, are flushed to disk, and replace the old file with one atomic rename.
"""

from __future__ import annotations

import io
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import TorchCheckpointIO

from fasttrain.models.spec import qualname, spec_of

log = logging.getLogger(__name__)

# Temp files carry this suffix; resume ignores them (a kill can leave one behind).
TEMP_SUFFIX = ".tmp"
# What torch.load(weights_only=True) reads back, besides containers of them.
_LOADABLE = (str, bytes, int, float, complex, bool, type(None), torch.Tensor, torch.dtype,
             torch.device, torch.Size)  # fmt: skip
_HPARAMS_KEYS = ("hyper_parameters", "datamodule_hyper_parameters")
_said: set[str] = set()
_LEFT_OUT = object()  # an object with no spec: not written
# A plain LightningModule's config (resolved, plain values), which rebuilds it (ModelSpec).
MODEL_SPEC_KEY = "model_spec"


class ModelSpec(Callback):
    """Writes the config that built a plain LightningModule, and its data module's class, into
    each checkpoint: evaluate, export and predict rebuild the module from them
    (fasttrain.checkpoints.load), whatever its own save_hyperparameters() keeps. A Task records
    its own (its hyperparameters and class)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        from fasttrain.models.task import DATA_TARGET_KEY, Task

        if isinstance(pl_module, Task):
            return
        checkpoint[MODEL_SPEC_KEY] = self.spec
        datamodule = getattr(trainer, "datamodule", None)
        if datamodule is not None:
            checkpoint[DATA_TARGET_KEY] = qualname(type(datamodule))


def loadable_hparams(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint with objects among its hyperparameters replaced by their Hydra specs (a
    factory's partial, a net that records its arguments) and any other object left out: a plain
    LightningModule's `save_hyperparameters()` keeps its optimizer partial and its net, which
    torch.load(weights_only=True) refuses, so the run could not test its best checkpoint or
    resume. fasttrain's tasks record plain values and pass through unchanged."""
    out = dict(checkpoint)
    for key in _HPARAMS_KEYS:
        if isinstance(out.get(key), dict):
            out[key] = {k: _loadable(v, f"{key}.{k}") for k, v in out[key].items()}
            out[key] = {k: v for k, v in out[key].items() if v is not _LEFT_OUT}
    return out


def _loadable(value: Any, where: str) -> Any:
    if isinstance(value, _LOADABLE):
        return value
    if isinstance(value, dict) or hasattr(value, "items"):
        items = {str(k): _loadable(v, f"{where}.{k}") for k, v in value.items()}
        return {k: v for k, v in items.items() if v is not _LEFT_OUT}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        kept = [v for v in (_loadable(v, where) for v in value) if v is not _LEFT_OUT]
        return tuple(kept) if isinstance(value, tuple) else kept
    spec = spec_of(value)
    if spec is not None:
        return _loadable(spec, where)  # what a partial's arguments hold, made loadable too
    if where not in _said:
        _said.add(where)
        log.warning("%s: a %s object, left out of the checkpoint (a checkpoint holds no code); "
                    "save_hyperparameters(ignore=[...]) leaves it out without this note",
                    where, type(value).__name__)  # fmt: skip
    return _LEFT_OUT


class AtomicCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO whose saves are atomic on local disks (remote URLs keep Lightning's)."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if "://" in str(path) or storage_options is not None:
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(loadable_hparams(checkpoint), buffer)
        # Hidden and unique (another rank or save may be writing too); "xb" keeps the umask's mode.
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
        try:
            with open(tmp, "xb") as file:
                file.write(buffer.getbuffer())
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, target)
        except OSError as err:
            Path(tmp).unlink(missing_ok=True)
            if err.filename is None:  # a write's error names no file: the checkpoint it was
                raise OSError(err.errno, err.strerror, str(target)) from err
            raise
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return None
