"""Reading checkpoints: `weights_only=True` always, every failure one line.

A net, optimizer or scheduler is saved as its Hydra spec (`{"_target_": "pkg.Class", **args}`,
fasttrain.models.spec), which names code instead of pickling it, so loading never executes
anything from the file.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch

from fasttrain.config.errors import UserError


def read_checkpoint(path: str | Path, expect: str = "ckpt_path") -> dict[str, Any]:
    """torch.load with weights_only=True, turning every way it can fail into one UserError."""
    file = Path(path)
    if not file.is_file():
        raise UserError(f"{expect}={path}: no such file")
    try:
        ckpt = torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        # weights_only refuses any pickled global (a callable, a class): name it, never run it.
        blocked = re.search(r"GLOBAL (\S+)", str(err))
        if blocked is None:
            raise UserError(
                f"{expect}={path}: not a readable checkpoint (corrupt or not torch)"
            ) from None
        raise UserError(
            f"{expect}={path}: refused, it holds a pickled object ({blocked.group(1)}) and "
            "checkpoints are loaded with weights_only=True, which never executes code"
        ) from None
    except Exception as err:
        raise UserError(
            f"{expect}={path}: not a readable checkpoint ({type(err).__name__})"
        ) from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt:
        raise UserError(f"{expect}={path}: not a Lightning checkpoint (no state_dict)")
    return ckpt


def load_classifier(path: str | Path) -> tuple[Any, dict[str, Any]]:
    """Rebuild a Classifier from a checkpoint: (model in eval mode, datamodule hyperparameters)."""
    from hydra.utils import instantiate

    from fasttrain.models import Classifier

    ckpt = read_checkpoint(path)
    hparams = ckpt.get("hyper_parameters") or {}
    if not isinstance(hparams.get("net"), dict) or "_target_" not in hparams["net"]:
        raise UserError(f"ckpt_path={path}: not a fasttrain Classifier checkpoint (no net spec)")
    net = instantiate(hparams["net"])
    optimizer = instantiate(hparams["optimizer"]) if hparams.get("optimizer") else None
    scheduler = instantiate(hparams["scheduler"]) if hparams.get("scheduler") else None
    model = Classifier(
        net=net, optimizer=optimizer, scheduler=scheduler,
        num_classes=hparams["num_classes"],
        scheduler_interval=hparams.get("scheduler_interval", "epoch"),
    )  # fmt: skip
    try:
        model.load_state_dict(ckpt["state_dict"])
    except RuntimeError as err:
        # torch lists every mismatched tensor on its own line; the error stays one line.
        detail = " ".join(str(err).split())
        detail = detail if len(detail) <= 300 else detail[:300] + "..."
        raise UserError(
            f"ckpt_path={path}: weights do not fit the net it names ({detail})"
        ) from None
    return model.eval(), dict(ckpt.get("datamodule_hyper_parameters") or {})
