"""Which code a checkpoint may name: a checkpoint never chooses what runs.

A checkpoint stores its net, optimizer, scheduler and data module as Hydra specs
(`{"_target_": "pkg.Name", **args}`). weights_only=True keeps pickled code out of the file, but
building a spec calls whatever its `_target_` names (Hydra also builds every nested `_target_`,
even under `_partial_`), so a crafted spec such as `numpy.savetxt` would write a file. Before
anything is built, every `_target_` in the specs must be one of:

- an nn.Module subclass defined in fasttrain.models.nets (the project's nets);
- an LR scheduler subclass defined in fasttrain.models.schedules;
- a LightningModule subclass defined in fasttrain.models (the project's tasks);
- an Optimizer or LR scheduler subclass defined in torch.optim;
- a LightningDataModule subclass defined in fasttrain.data;
- a target that some YAML file of the project's own conf/ names (your own net in
  conf/model/net/my_net.yaml is allowed that way);
- a name the caller passes in `allow`.

The name is checked against these prefixes and conf/ before anything is imported; only then is
it resolved, and the object's type confirmed. Each slot then admits only classes of its own kind
(`SLOT_KINDS`: a net is an nn.Module, an optimizer a torch Optimizer, ...), whatever conf/ names:
conf/ also names loggers and callbacks, whose constructors write files (an MLflow store, say),
and a checkpoint must not place one in its scheduler slot. Targets in any other slot are refused.
Values with `${...}` interpolations are refused too: building a spec would resolve them (reading
environment variables, for one). Nothing is built before every check has passed.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from fasttrain.config.errors import UserError
from fasttrain.config.project import CONFIG_DIR

ALLOWED = (
    "a net or task of this project, a torch optimizer or scheduler, a data module of this "
    "project, or a target in conf/"
)


def _is_net(obj: Any) -> bool:
    from torch import nn

    return _is_class_in(obj, nn.Module, "fasttrain.models.nets")


def _is_optim(obj: Any) -> bool:
    from torch.optim import Optimizer
    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    return any(_is_class_in(obj, base, "torch.optim") for base in
               (Optimizer, LRScheduler, ReduceLROnPlateau))  # fmt: skip


def _is_schedule(obj: Any) -> bool:
    from torch.optim.lr_scheduler import LRScheduler

    return _is_class_in(obj, LRScheduler, "fasttrain.models.schedules")


def _is_task(obj: Any) -> bool:
    from lightning import LightningModule

    return _is_class_in(obj, LightningModule, "fasttrain.models")


def _is_data(obj: Any) -> bool:
    from lightning import LightningDataModule

    return _is_class_in(obj, LightningDataModule, "fasttrain.data")


def _is_class_in(obj: Any, base: type, package: str) -> bool:
    module = getattr(obj, "__module__", None) or ""
    in_package = module == package or module.startswith(f"{package}.")
    return inspect.isclass(obj) and issubclass(obj, base) and in_package


# name prefix -> the type check of the object it resolves to
KINDS: dict[str, Callable[[Any], bool]] = {
    "fasttrain.models.nets.": _is_net,
    "fasttrain.models.schedules.": _is_schedule,
    "fasttrain.models.": _is_task,
    "torch.optim.": _is_optim,
    "fasttrain.data.": _is_data,
}


@functools.cache
def conf_targets(config_dir: str = CONFIG_DIR) -> dict[str, tuple[str, ...]]:
    """Every `_target_` named in a YAML file under `config_dir` -> those files (relative)."""
    import yaml

    found: dict[str, list[str]] = {}
    for file in sorted(Path(config_dir).rglob("*.yaml")):
        try:
            docs = list(yaml.safe_load_all(file.read_text()))
        except (OSError, yaml.YAMLError):
            continue  # Hydra reports a broken config file itself
        for target in (t for doc in docs for t in _targets(doc)):
            if isinstance(target, str) and "${" not in target:
                found.setdefault(target, []).append(file.relative_to(config_dir).as_posix())
    return {target: tuple(files) for target, files in found.items()}


def is_allowed(target: str, allow: Collection[str] = (), config_dir: str = CONFIG_DIR) -> bool:
    """Whether a spec may name `target` (see the module doc); imports only an allowed prefix."""
    if target in allow or target in conf_targets(config_dir):
        return True
    return _of_allowed_kind(target)


def _of_allowed_kind(target: str) -> bool:
    """`target` under one of the KINDS prefixes, and of that prefix's kind."""
    check = next((c for prefix, c in KINDS.items() if target.startswith(prefix)), None)
    if check is None:
        return False
    from hydra.utils import get_object

    try:
        return check(get_object(target))
    except Exception:  # not importable: Hydra could not build it either
        return False


def slot_kinds() -> dict[str, tuple[type, ...]]:
    """Spec slot -> the classes a target in it must subclass (torch and Lightning load here, not
    on import: the command line's fast paths import this module)."""
    from lightning import LightningDataModule, LightningModule
    from torch import nn
    from torch.optim import Optimizer
    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

    return {
        "net": (nn.Module,),
        "optimizer": (Optimizer,),
        "scheduler": (LRScheduler, ReduceLROnPlateau),
        "task": (LightningModule,),
        "data": (LightningDataModule,),
    }


def check_specs(
    specs: Mapping[str, Any], source: str, allow: Collection[str] = (),
    config_dir: str = CONFIG_DIR,
) -> None:  # fmt: skip
    """Raise one UserError, e.g. `ckpt_path=X: refused, its net names numpy.savetxt, ...`, unless
    every `_target_` nested anywhere in `specs` (name -> spec or plain value) is allowed and of
    its slot's kind."""
    kinds = slot_kinds()
    for name, spec in specs.items():
        for target in _targets(spec):
            if not isinstance(target, str) or not is_allowed(target, allow, config_dir):
                shown = target if isinstance(target, str) else repr(target)
                raise UserError(f"{source}: refused, its {name} names {shown}, "
                                f"which is not {ALLOWED}")  # fmt: skip
            _check_kind(name, target, kinds.get(name), source)
        interpolation = next(_interpolations(spec), None)
        if interpolation is not None:
            shown = interpolation if len(interpolation) <= 80 else interpolation[:80] + "..."
            raise UserError(
                f"{source}: refused, its {name} holds an interpolation ({shown!r}); "
                "checkpoint specs hold plain values"
            )


def _check_kind(name: str, target: str, kind: tuple[type, ...] | None, source: str) -> None:
    """`target` (allowed by name) must resolve to a subclass of its slot's `kind`; None: a slot
    that holds plain values only."""
    if kind is None:
        raise UserError(f"{source}: refused, its {name} names {target}, but {name} holds plain "
                        f"values; only {', '.join(slot_kinds())} name classes")  # fmt: skip
    obj = _resolve(target)
    if not (inspect.isclass(obj) and issubclass(obj, kind)):
        wanted = " or ".join(k.__name__ for k in kind)
        raise UserError(f"{source}: refused, its {name} names {target}, which is not a "
                        f"{wanted} (a {name} slot admits nothing else)")  # fmt: skip


def _resolve(target: str) -> Any:
    """The object a dotted name (allowed already) names, or None where it names nothing: the
    longest importable module, then attributes (hydra's get_object logs an error instead)."""
    import importlib

    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except Exception:  # not a module (or not importable): a shorter prefix may be
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name, None)
        return obj
    return None


def _targets(value: Any) -> Iterator[Any]:
    """The value of every `_target_` key in `value`, at any depth."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            if key == "_target_":
                yield item
            else:
                yield from _targets(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _targets(item)


def _interpolations(value: Any) -> Iterator[str]:
    if isinstance(value, str) and "${" in value:
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _interpolations(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _interpolations(item)


# A training run's slot -> (its node in the config, the conf/ folder a config naming it goes in)
RUN_SLOTS = {
    "task": ("model", "model"),
    "net": ("model.net", "model/net"),
    "optimizer": ("model.optimizer", "model/optimizer"),
    "scheduler": ("model.scheduler", "model/scheduler"),
    "data": ("data", "data"),
}


def check_loadable(job: Any, config_dir: str = CONFIG_DIR) -> None:
    """Refuse a training run whose classes its own checkpoints could not name: evaluate, export
    and predict would refuse them (a net typed as `model.net._target_=mypkg.Wide`), so the
    commands the run prints at its end would fail. Naming the class in a config under conf/
    admits it, on purpose and once, where the user keeps their configs."""
    from omegaconf import OmegaConf

    for node, folder in RUN_SLOTS.values():
        target = OmegaConf.select(job, f"{node}._target_", default=None)
        # The kind first: the config imported its targets already, and reading every file
        # under conf/ (conf_targets) costs ~0.2 s of a run's start-up on a 2-core machine.
        if (
            target is None
            or _of_allowed_kind(str(target))
            or is_allowed(str(target), config_dir=config_dir)
        ):
            continue
        stem = str(target).rsplit(".", 1)[-1].lower()
        raise UserError(
            f"{node}._target_={target}: its checkpoints could not be loaded again (evaluate, "
            f"export and predict build only {ALLOWED}); name it in a config, e.g. "
            f"conf/{folder}/{stem}.yaml holding `_target_: {target}`, and select that"
        )
