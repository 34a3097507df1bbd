"""Reading checkpoints: `weights_only=True` always, every failure one line.

A net, optimizer or scheduler is saved as its Hydra spec (`{"_target_": "pkg.Class", **args}`,
fasttrain.models.spec), which names code instead of pickling it. Unpickling never executes
anything from the file, and a spec is built only after fasttrain.checkpoints.allow has checked
every target it names, so a checkpoint cannot choose what runs either.
"""

from __future__ import annotations

import pickle
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch

from fasttrain.checkpoints.allow import check_specs
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


def follows_the_contract(task: Any) -> bool:
    """A task class whose hyperparameters rebuild it (Task.from_hparams): a Task that writes
    the contract's pieces (the base class writes none). Any other LightningModule is rebuilt
    from the config its run recorded (fasttrain.checkpoints.io.ModelSpec)."""
    from fasttrain.models.task import Task

    return isinstance(task, type) and issubclass(task, Task) and task.loss is not Task.loss


def load_task(path: str | Path, allow: Collection[str] = ()) -> tuple[Any, dict[str, Any]]:
    """Rebuild the model a checkpoint was trained as: (model in eval mode, data spec). A Task
    (fasttrain.models.task) from its hyperparameters; any other LightningModule from the config
    that built it, which its run recorded.

    The data spec is the data module's hyperparameters, with its `_target_` when the checkpoint
    recorded it (checkpoints of older versions did not). Every target the checkpoint names (the
    model's class, its net, optimizer, scheduler and data module) must pass
    fasttrain.checkpoints.allow before anything is built; `allow` adds exact dotted names (e.g.
    "mypkg.nets.MyNet", a net class kept outside fasttrain.models.nets that conf/ does not name)
    for callers that load such checkpoints on purpose.
    """
    from fasttrain.checkpoints.io import MODEL_SPEC_KEY
    from fasttrain.models.task import DATA_TARGET_KEY

    ckpt = read_checkpoint(path)
    data = ckpt.get("datamodule_hyper_parameters") or {}
    if not isinstance(data, dict):
        raise UserError(f"ckpt_path={path}: not a fasttrain task checkpoint (no data spec)")
    data = dict(data)
    if DATA_TARGET_KEY in ckpt:
        data["_target_"] = ckpt[DATA_TARGET_KEY]
    spec = ckpt.get(MODEL_SPEC_KEY)
    if spec is not None:
        model = _from_spec(spec, data, path, allow)
    else:
        model = _from_hparams(ckpt, data, path, allow)
    _load_weights(model, ckpt, path)
    return model.eval(), data


def _from_hparams(ckpt: dict[str, Any], data: dict[str, Any], path: str | Path,
                  allow: Collection[str]) -> Any:  # fmt: skip
    """A Task, from the hyperparameters its checkpoint holds."""
    from hydra.errors import InstantiationException
    from hydra.utils import get_object

    from fasttrain.models.classifier import PRE_CONTRACT_TASK
    from fasttrain.models.task import TASK_TARGET_KEY

    hparams = ckpt.get("hyper_parameters") or {}
    net_spec = hparams.get("net") if isinstance(hparams, dict) else None
    if not isinstance(net_spec, dict) or "_target_" not in net_spec:
        raise UserError(f"ckpt_path={path}: not a fasttrain task checkpoint (no net spec)")
    task_target = ckpt.get(TASK_TARGET_KEY, PRE_CONTRACT_TASK)
    check_slots(task_target, hparams, data, f"ckpt_path={path}", allow)
    task = get_object(str(task_target))
    if not follows_the_contract(task):
        raise UserError(f"ckpt_path={path}: its task {task_target} does not follow the task "
                        "contract (a subclass of fasttrain.models.task.Task)")  # fmt: skip
    try:
        return task.from_hparams(hparams)
    except (InstantiationException, KeyError, TypeError, ValueError) as err:
        # ConfigError is a ValueError: a value the task refuses, named by the message.
        raise UserError(f"ckpt_path={path}: its hyper_parameters do not rebuild a "
                        f"{task.__name__} ({_one_line(err)})") from None  # fmt: skip


def _from_spec(spec: Any, data: dict[str, Any], path: str | Path,
               allow: Collection[str]) -> Any:  # fmt: skip
    """A plain LightningModule, from the config its run recorded: checked as a Task's
    hyperparameters are (the module's class in the task slot, each argument in its own)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    if not isinstance(spec, dict) or not isinstance(spec.get("_target_"), str):
        raise UserError(f"ckpt_path={path}: refused, its model spec is not a config node")
    args = {k: v for k, v in spec.items() if k != "_target_"}
    check_slots(spec["_target_"], args, data, f"ckpt_path={path}", allow)
    try:
        return instantiate(spec, _convert_="all")
    except (InstantiationException, KeyError, TypeError, ValueError) as err:
        raise UserError(f"ckpt_path={path}: its model spec does not rebuild "
                        f"{spec['_target_']} ({_one_line(err)})") from None  # fmt: skip


def check_slots(task_target: Any, args: dict[str, Any], data: dict[str, Any], source: str,
                allow: Collection[str]) -> None:  # fmt: skip
    """The fixed slots (the task's class, the data module) and every argument, each through
    the allowlist on its own: an argument named `task` or `data` checks as itself, never in
    place of the slot it shares a name with."""
    check_specs({"task": {"_target_": task_target}, "data": data}, source, allow)
    check_specs(args, source, allow)


def _load_weights(model: Any, ckpt: dict[str, Any], path: str | Path) -> None:
    """The checkpoint's weights and the module's own records (a language model's tokenizer)."""
    try:
        model.load_state_dict(ckpt["state_dict"])
    except RuntimeError as err:
        # torch lists every mismatched tensor on its own line; the error stays one line.
        raise UserError(
            f"ckpt_path={path}: weights do not fit the net it names ({_one_line(err)})"
        ) from None
    try:
        model.on_load_checkpoint(ckpt)
    except UserError as err:  # a record the task refuses: "its tokenizer ...", named here
        raise UserError(f"ckpt_path={path}: {err}") from None
    tokenizer, vocab = getattr(model, "tokenizer_json", None), getattr(model, "vocab_size", None)
    # A language model's tokenizer: its own format, and ids within the model's embedding.
    if tokenizer is not None and vocab is not None:
        from fasttrain.data.tokenizer import check_vocabulary, from_json

        where = f"ckpt_path={path}: its tokenizer"
        check_vocabulary(from_json(tokenizer, where), int(vocab), where)


def _one_line(err: BaseException, limit: int = 300) -> str:
    detail = " ".join(str(err).split())
    return detail if len(detail) <= limit else detail[:limit] + "..."
