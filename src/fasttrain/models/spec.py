"""Hydra specs (`{"_target_": "pkg.Class", **args}`) of the objects a task is built from.

Checkpoints store these plain containers instead of pickled objects, so they load with
`torch.load(weights_only=True)` and a net is rebuilt by instantiating its spec.
"""

from __future__ import annotations

import functools
from typing import Any

from torch import nn


def plain(value: Any) -> Any:
    """OmegaConf containers, tuples and the like -> dicts, lists and scalars."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [plain(v) for v in value]
    return value


def qualname(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def spec_of(obj: Any) -> dict[str, Any] | None:
    """The Hydra spec that rebuilds `obj`: a partial (optimizer/scheduler factory), or a net that
    recorded its constructor arguments in `.hparams` (fasttrain's nets do). None otherwise."""
    if obj is None:
        return None
    if isinstance(obj, functools.partial):
        spec = {"_target_": qualname(obj.func), "_partial_": True, **plain(obj.keywords)}
        if obj.args:  # Hydra passes `_args_` positionally
            spec["_args_"] = plain(list(obj.args))
        return spec
    hparams = getattr(obj, "hparams", None)
    if isinstance(obj, nn.Module) and hparams is not None:
        return {"_target_": qualname(type(obj)), **plain(hparams)}
    return None
