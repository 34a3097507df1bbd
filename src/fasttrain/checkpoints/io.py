"""Checkpoint files that are either the old one or the new one, never half of each.

Lightning's TorchCheckpointIO writes through an fsspec transaction, which stages a local file in
the system temp dir and moves it into place on commit; across file systems that move is a copy
over the old file, and nothing is fsync'ed, so a kill or power loss mid-save can leave a
truncated `last.ckpt` and nothing to resume from. Here the new bytes go to a temp file in the
same directory, are flushed to disk, and replace the old file with one atomic rename.
"""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

# Temp files carry this suffix; resume ignores them (a kill can leave one behind).
TEMP_SUFFIX = ".tmp"


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
        torch.save(checkpoint, buffer)
        # Hidden and unique (another rank or save may be writing too); "xb" keeps the umask's mode.
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{TEMP_SUFFIX}")
        try:
            with open(tmp, "xb") as file:
                file.write(buffer.getbuffer())
                file.flush()
                os.fsync(file.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return None
