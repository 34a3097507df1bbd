"""Whether a checkpoint fits the run that would continue from it (`check_fits`): readable, of
the same model, data split and recipe, within trainer.max_epochs; each model setting that
differs said in one line. Loaded only when there is a checkpoint to continue from
(fasttrain.checkpoints.resume picks it).

fasttrain.cli checks the checkpoint a run would continue from before Hydra writes anything into
the run folder, so a refusal never touches the run it refuses to continue. That check reads the
file once: fit's own `check_fits` (and `written_with_averaging`) on the same model, data module
and unchanged file find what it read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from pathlib import Path
from typing import Any, cast

from fasttrain.config.errors import UserError
from fasttrain.config.project import shown

log = logging.getLogger(__name__)


# What check_fits read of a checkpoint a model passed: {model: ((file, mtime, size), id of
# the data module, the checkpoint's epoch, whether it was written with weight averaging)}.
_passed: weakref.WeakKeyDictionary[Any, tuple[Any, int, Any, bool]] = weakref.WeakKeyDictionary()


def _file_key(path: str | Path) -> tuple[str, int, int]:
    st = os.stat(path)
    return os.path.realpath(path), st.st_mtime_ns, st.st_size


def _passed_before(ckpt_path: str, model: Any, data: Any) -> tuple[Any, int, Any, bool] | None:
    """The record of this model (and data module) passing check_fits on this file as it is."""
    try:
        record = _passed.get(model) if model is not None else None
    except TypeError:  # a model that cannot be weakly referenced: checked each time
        return None
    if record is None or record[1] != id(data):
        return None
    try:
        return record if record[0] == _file_key(ckpt_path) else None
    except OSError:
        return None


def written_with_averaging(ckpt_path: str, model: Any = None, data: Any = None) -> bool:
    """Whether the checkpoint holds averaged weights (callbacks/averaging=ema or swa): from what
    check_fits read, else from the file."""
    record = _passed_before(ckpt_path, model, data)
    if record is not None:
        return record[3]
    import torch

    return "current_model_state" in torch.load(ckpt_path, weights_only=True, mmap=True)


def check_fits(ckpt_path: str, model: Any, max_epochs: int | None = None,
               resume: str | None = None, data: Any = None) -> None:  # fmt: skip
    """Refuse, in one line, a checkpoint this run cannot continue from: unreadable, of another
    model (Lightning would fail deep in fit), of another data split (`data`, the run's data
    module: its seed, fractions, path, fold...), or further than `trainer.max_epochs`. Say in
    one line each model setting that differs from the checkpoint's, and whether it applies.

    `model` may live on the meta device (only names and shapes are compared) or be None (not
    compared). `resume` is the value that chose the checkpoint ("auto": the message then names
    what else there is). The file is memory-mapped and loaded with weights_only: it is not read
    whole, and pickled code in it is refused unexecuted. A model and data module that passed
    on this file (unchanged since) are not compared again: only the epoch is.
    """
    record = _passed_before(ckpt_path, model, data)
    if record is not None:
        _within_max_epochs(ckpt_path, record[2], max_epochs)
        return
    ckpt = _read(ckpt_path, resume)
    which = f"resume=auto: {shown(ckpt_path)}:" if resume == "auto" else f"resume={ckpt_path}:"
    if data is not None:
        _same_split(ckpt.get("datamodule_hyper_parameters"), dict(data.hparams), which)
    if model is not None:
        named = f"resume=auto: {shown(ckpt_path)}" if resume == "auto" else which
        _same_model(ckpt["state_dict"], model.state_dict(), named)
        _same_recipe(ckpt.get("hyper_parameters"), model, which)
        for line in settings_that_differ(ckpt.get("hyper_parameters"), dict(model.hparams)):
            log.warning(f"{which} {line}")
    _restorable(ckpt, which)
    _within_max_epochs(ckpt_path, ckpt.get("epoch"), max_epochs)
    if model is not None:
        with contextlib.suppress(TypeError, OSError):  # no record: the next check reads again
            key = _file_key(ckpt_path)
            _passed[model] = (key, id(data), ckpt.get("epoch"), "current_model_state" in ckpt)


# The training state Lightning's fit restores from a checkpoint, and the type it reads each as.
TRAINING_STATE = {"epoch": int, "global_step": int, "loops": dict, "optimizer_states": list,
                  "lr_schedulers": list, "callbacks": dict}  # fmt: skip


def _restorable(ckpt: dict[str, Any], which: str) -> None:
    """Refuse a checkpoint without the training state fit restores, or with a part of another
    type (a weights-only save, a damaged or crafted file): Lightning failed on it deep inside
    fit, a traceback with the run folder written."""
    for key, kind in TRAINING_STATE.items():
        value: Any = ckpt.get(key)
        bad = not isinstance(value, kind) or isinstance(value, bool)
        if not bad and kind is int:
            bad = value < 0
        elif not bad and key == "loops":
            bad = not isinstance(value.get("fit_loop"), dict)
        elif not bad and kind is list:
            bad = not all(isinstance(state, dict) for state in value)
        if bad:
            got = "missing" if key not in ckpt else f"{type(value).__name__} {str(value)[:40]}"
            raise UserError(
                f"{which} not a checkpoint fit can continue from ({key}: {got}); "
                "resume=never starts over (evaluate, export and predict still read its weights)"
            )


def _within_max_epochs(ckpt_path: str, epoch: Any, max_epochs: int | None) -> None:
    # Lightning's own rule (it raises MisconfigurationException with a traceback, in fit).
    limited = isinstance(max_epochs, int) and max_epochs != -1
    if limited and isinstance(epoch, int) and epoch > cast(int, max_epochs):
        raise UserError(
            f"trainer.max_epochs={max_epochs}: {shown(ckpt_path)}, the checkpoint to resume, "
            f"is at epoch {epoch}; set trainer.max_epochs={epoch} or more, or start over "
            "with resume=never"
        )


# Data settings a resumed run may change: how batches are loaded and augmented, not which
# samples make up each split.
FREE_DATA = ("crop", "padding", "scale", "flip", "shuffle_buffer", "download")
# Model settings a resumed run takes from the checkpoint, whatever the config says now: the
# optimizer's and the lr schedule's state (Lightning restores both).
RESTORED = ("optimizer", "scheduler", "lr_scaling", "base_batch_size", "scheduler_interval")


def _same_split(saved: Any, own: dict[str, Any], which: str) -> None:
    """The data settings that define the splits (seed, fractions, path, fold, ...) are the
    checkpoint's: another value would train on what was held out (and test on what was
    trained on) without a word."""
    from fasttrain.data.base import LOADER_ARGS, SPLIT_RECORD, split_change

    if not isinstance(saved, dict):
        return  # checkpoints of older versions recorded no data settings
    change = split_change(saved.get(SPLIT_RECORD), own.get(SPLIT_RECORD))
    if change:  # the same settings on other files: said, since adding data is a reason to resume
        log.warning(f"{which} {change}; training goes on with the files there now")
    for key, value in own.items():
        if key in LOADER_ARGS or key in FREE_DATA or key == SPLIT_RECORD or key not in saved:
            continue
        if not _same(_plain(saved[key]), _plain(value)):
            via = " (set by seed=)" if key == "seed" else ""
            raise UserError(
                f"{which} data.{key}={_plain(value)}{via} differs from the checkpoint's "
                f"data.{key}={_plain(saved[key])}, which defines the data split; continue with "
                f"data.{key}={_plain(saved[key])}, or start over: resume=never"
            )


def settings_that_differ(saved: Any, own: dict[str, Any]) -> list[str]:
    """One line per model setting (flattened: optimizer.lr) whose value differs from the
    checkpoint's: whether this run uses it or the checkpoint's state wins. This run's objects
    (an optimizer partial, a net) are compared in the form the checkpoint keeps them
    (fasttrain.checkpoints.io.loadable_hparams: their specs, a partial's positional args too)."""
    from fasttrain.checkpoints.io import loadable_hparams

    if not isinstance(saved, dict):
        return []
    kept = loadable_hparams({"hyper_parameters": own})["hyper_parameters"]
    old, new = _flat(saved), _flat(kept)
    lines = []
    for key in sorted(old.keys() & new.keys()):
        if key.endswith("_target_") or _same(old[key], new[key]):
            continue
        change = f"model.{key}={_shown(new[key])} (the checkpoint's: {_shown(old[key])})"
        if key.split(".")[0] in RESTORED:
            why = "the optimizer and lr schedule continue from the checkpoint's state"
            lines.append(f"{change} is ignored: {why}; start over (resume=never) to train with it")
        else:
            lines.append(f"{change} applies from here on")
    return lines


def _same(a: Any, b: Any) -> bool:
    """Equal settings. Tensors by shape, dtype and values: `==` on one gives a tensor, whose
    truth is ambiguous (a plain module may keep class weights among its hyperparameters)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        both = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        return both and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(_same, a, b))
    try:
        return bool(a == b)
    except (TypeError, ValueError, RuntimeError):  # an array's `==`, an object's own
        return repr(a) == repr(b)


def _shown(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor) and value.numel() > 8:
        return f"<{str(value.dtype).removeprefix('torch.')} tensor of shape {list(value.shape)}>"
    return value


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        flat.update(_flat(value, f"{name}.") if isinstance(value, dict) else {name: _plain(value)})
    return flat


def _plain(value: Any) -> Any:
    """Comparable: tuples and lists alike, numbers as they are."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _same_model(state: dict[str, Any], own: dict[str, Any], which: str) -> None:
    missing, unexpected = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
    wrong = [k for k in own.keys() & state.keys() if own[k].shape != state[k].shape]
    if missing or unexpected or wrong:
        first = (
            f"shape of {wrong[0]}: {list(state[wrong[0]].shape)} vs {list(own[wrong[0]].shape)}"
            if wrong
            else f"missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
        raise UserError(
            f"{which} the checkpoint is of a different model ({first}); "
            "use the model config it was trained with, or resume=never"
        )


def _same_recipe(saved: Any, model: Any, which: str) -> None:
    """The net's settings that change what its weights compute and no parameter's shape (a
    GPT's norm=rms or layer, its mlp, ...: the net names them in `fixed_by_weights`) are the
    checkpoint's: another value would go on training other functions of the same weights. A
    checkpoint without the setting was written before it existed: its value is the default."""
    import inspect

    net = getattr(model, "net", None)
    names = getattr(net, "fixed_by_weights", ())
    trained = saved.get("net") if isinstance(saved, dict) else None
    if not names or not isinstance(trained, dict):
        return
    defaults = inspect.signature(type(net)).parameters
    own = dict(model.hparams).get("net") or {}
    for key in names:
        default = defaults[key].default
        old, new = _plain(trained.get(key, default)), _plain(own.get(key, default))
        if old != new:
            raise UserError(
                f"{which} model.net.{key}={_override(new)} differs from the checkpoint's "
                f"model.net.{key}={_override(old)}, which its weights were trained with; continue "
                f"with model.net.{key}={_override(old)}, or start over: resume=never"
            )


def _override(value: Any) -> str:
    """A value as typed in an override: null, true, false."""
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _read(path: str | Path, resume: str | None = None) -> dict[str, Any]:
    """The checkpoint, memory-mapped; its one-line refusal from read_checkpoint otherwise."""
    ckpt = _mapped(path)
    if ckpt is not None:
        return ckpt
    from fasttrain.checkpoints.load import read_checkpoint  # a checkpoint there: only then

    try:
        return read_checkpoint(path, expect="resume")
    except UserError as err:
        if resume != "auto":
            raise
        reason = str(err).removeprefix(f"resume={path}: ")
        raise UserError(f"resume=auto: {shown(path)}: {reason}; {_instead(Path(path))}") from None


def _mapped(path: str | Path) -> dict[str, Any] | None:
    import torch

    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return None
    return ckpt if isinstance(ckpt, dict) and "state_dict" in ckpt else None


def _instead(bad: Path) -> str:
    """What to do when resume=auto picked an unreadable checkpoint: the newest readable one
    beside it (the best checkpoint, usually), or starting over."""
    others = sorted(bad.parent.glob("*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
    good = next((p for p in others if p != bad and _mapped(p) is not None), None)
    if good is None:
        return "no readable checkpoint beside it: start over with resume=never"
    return f"continue from the one beside it with resume={shown(good)}, or start over: resume=never"
