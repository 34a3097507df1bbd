"""Check a composed config against the signatures of the classes it names.

Constructor signatures are the schema: every node with a
`_target_` is checked before anything is built — unknown keys (with a "did you mean"), missing
required arguments, and values whose type does not fit the annotation, e.g.
`trainer.precision=17: expected one of 64, 32, 16, '16-mixed', ...`, and values outside the
range an annotation declares (fasttrain.config.domains: `lr: Annotated[float, Positive]`).
Rules across values are the constructors' own business (they raise ConfigError).
The top-level keys of each entry config have signatures too (fasttrain.config.settings).
"""

from __future__ import annotations

import collections.abc as abc
import difflib
import inspect
import math
import typing
from typing import Annotated, Any, Literal, cast

from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig, OmegaConf

from fasttrain.config import settings
from fasttrain.config.domains import Choice, domain_of, is_union, path_rule_of
from fasttrain.config.errors import ConfigError, UserError

_SPECIAL_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}
_SEQUENCES = {list, tuple, set, frozenset, abc.Sequence, abc.MutableSequence, abc.Collection}
_MAPPINGS = {dict, abc.Mapping, abc.MutableMapping}


def validate(node: Any, path: str = "", entry: str | None = None) -> None:
    """Walk `node`; check every `_target_` node it holds, and with `entry` (a config name such as
    "train") the top-level keys of that entry. Raises UserError on the first problem."""
    if entry is not None:
        settings.check_pairing(node)
        check_settings(node, entry)
    if isinstance(node, DictConfig):
        if "_target_" in node:
            params, hints = _signature(node._target_, path)
            if params:  # none for a builtin without a signature: nothing to check against
                _check_args(node, node._target_, params, hints, path)
            _check_optimizer(node, path)
            _check_scheduler(node, path)
        # data and trainer first: the values the others take from them (a net's
        # `${data.channels}`, a callback's `${trainer.log_every_n_steps}`) are then refused
        # under their own names
        for key in sorted(node, key=lambda k: k not in ("data", "trainer")) if not path else node:
            if OmegaConf.is_missing(node, key):
                raise UserError(
                    f"{_join(path, key)} is required (it has no value; set it as an override)"
                )
            child = node[key]
            validate(
                child if isinstance(child, (DictConfig, ListConfig)) else None, _join(path, key)
            )
    elif isinstance(node, ListConfig):
        for i, item in enumerate(node):
            validate(item, f"{path}[{i}]")


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _signature(target: str, path: str) -> tuple[dict[str, inspect.Parameter], dict[str, Any]]:
    """Parameters and resolved annotations of `target`.

    fasttrain's own classes, and a project's subclasses of them (its task on Task), pass
    `**kwargs` on to their base class, so for them the MRO is followed and subclasses need not
    repeat the base arguments. Elsewhere `**kwargs` may go anywhere (TensorBoardLogger hands
    them to SummaryWriter), so it accepts any extra key.
    """
    try:
        obj = get_object(target)
    except Exception as err:
        detail = " ".join(str(err).split())  # Hydra's message spans lines; the error is one
        raise UserError(
            f"{_join(path, '_target_')}={target}: cannot be imported ({detail})"
        ) from None
    return parameters_of(obj)


def parameters_of(obj: Any) -> tuple[dict[str, inspect.Parameter], dict[str, Any]]:
    """What `_signature` reads of an imported class or function (a checkpoint's task, too)."""
    if inspect.isclass(obj) and any(c.__module__.startswith("fasttrain.") for c in obj.__mro__):
        funcs = [vars(c)["__init__"] for c in obj.__mro__ if "__init__" in vars(c)]
    else:
        funcs = [obj]
    params: dict[str, inspect.Parameter] = {}
    hints: dict[str, Any] = {}
    for func in funcs:
        try:
            sig = inspect.signature(func)
        except (TypeError, ValueError):  # builtins without a signature: nothing to check against
            break
        try:
            func_hints = typing.get_type_hints(func, include_extras=True)  # with domains
        except Exception:  # names only imported under TYPE_CHECKING: check what resolves
            func_hints = {}
        for name, param in sig.parameters.items():
            if name != "self" and name not in params:
                params[name], hints[name] = param, func_hints.get(name, param.annotation)
        if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            params = {n: p for n, p in params.items() if p.kind is not p.VAR_KEYWORD}
            return params, hints
    return params, hints


def check_settings(cfg: DictConfig, entry_name: str) -> None:
    """The plain top-level keys of conf/<entry_name>.yaml against their signature in
    fasttrain.config.settings, then its range checks. Group nodes (data:, paths:, ...) are
    left to validate()."""
    entry = settings.ENTRIES[entry_name]
    params, hints = _signature(f"{entry.__module__}.{entry.__qualname__}", "")
    own = frozenset(k for k in cfg if k not in params and _is_group(cfg, k))
    _check_args(cfg, "", params, hints, "", skip=own, finite=False)
    for group, keys in settings.GROUPS.items():  # plain groups (no _target_): paths, tuner
        if group in cfg and _is_group(cfg, group) and "_target_" not in cfg[group]:
            _check_args(cfg[group], "", *parameters_of(keys), group)
    values = {k: _plain(cfg[k]) for k in params if k in cfg and not OmegaConf.is_missing(cfg, k)}
    required = [n for n, p in params.items() if p.default is p.empty]
    if any(n not in values for n in required):
        return  # validate() names the missing key
    try:
        entry(**values)
    except ConfigError as err:
        raise UserError(str(err)) from None
    # after the entry's own domains, which name the range (temperature: a finite number >= 0)
    for key in values:
        _check_finite(cfg, key, "")


def _is_group(cfg: DictConfig, key: Any) -> bool:
    return OmegaConf.is_missing(cfg, key) is False and isinstance(cfg[key], DictConfig)


def _plain(value: Any) -> Any:
    return (
        OmegaConf.to_container(value, resolve=True)
        if isinstance(value, (DictConfig, ListConfig))
        else value
    )


def _check_args(
    node: DictConfig,
    target: str,
    params: dict[str, inspect.Parameter],
    hints: dict[str, Any],
    path: str,
    skip: frozenset[Any] = frozenset(),
    finite: bool = True,
) -> None:
    """Each key of `node` is an argument of `target` with a value of the annotated type (and,
    with `finite`, no nan or inf in it)."""
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    named = [n for n, p in params.items() if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    for key in node:
        if key in _SPECIAL_KEYS or key in skip:
            continue
        if key not in params:
            if takes_kwargs:
                if finite:
                    _check_finite(node, key, path)
                continue
            close = difflib.get_close_matches(str(key), named, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; valid: {', '.join(named)}"
            if not target:  # an entry's top-level key, or a plain group's (tuner.lr_find)
                raise UserError(f"{_join(path, key)}: no such key{hint}")
            raise UserError(f"{_join(path, key)}: {target} has no argument '{key!s}'{hint}")
        if OmegaConf.is_missing(node, key):
            continue  # reported by validate() with the path
        child = node[key]
        if isinstance(child, DictConfig) and "_target_" in child:
            continue  # built by Hydra and checked on its own
        value = _plain(child)
        param = params[key]
        annotation = hints.get(key, param.annotation)
        if value is None and param.default is None:
            continue  # `x: int = None` is common shorthand for Optional
        if not _matches(value, annotation):
            raise UserError(f"{_join(path, key)}={value!r}: expected {_describe(annotation)}")
        domain = domain_of(annotation)  # its declared range, which also says finite
        rule = domain or path_rule_of(annotation)
        if rule is not None and not rule.admits(value):
            raise UserError(f"{_join(path, key)}={value!r}: {rule.says(value)}")
        if finite and domain is None:
            _check_finite(node, key, path)
    if not node.get("_partial_", False):
        given = set(node.keys())
        for name in named:
            p = params[name]
            if p.default is p.empty and name not in given and p.kind is not p.POSITIONAL_ONLY:
                raise UserError(f"{_join(path, name)} is required by {target or 'this entry'}")


def _check_finite(node: DictConfig, key: Any, path: str) -> None:
    """No NaN or inf in a value, or in the lists and mappings it holds: no argument of any
    component means them (an lr, a weight decay, a softcap, a scheduler's factor), and each
    would only show up later as a NaN loss or a traceback from the component."""
    child = node[key]
    if isinstance(child, DictConfig) and "_target_" in child:
        return  # checked on its own
    value = _plain(child)
    bad = next(_non_finite(value), None)
    if bad is None:
        return
    shown = f"{_join(path, key)}={value!r}"
    if bad is not value:
        shown += f" (holds {bad!r})"
    raise UserError(f"{shown}: expected a finite number (not nan or inf)")


def _non_finite(value: Any) -> abc.Iterator[float]:
    if isinstance(value, float) and not math.isfinite(value):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _non_finite(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _non_finite(item)


def _check_optimizer(node: DictConfig, path: str) -> None:
    """Build an optimizer factory on a dummy parameter: its range checks (lr, momentum, betas,
    eps, ...) then fail now, naming the override, instead of inside fit() after the run began.

    torch accepts lr=0 (a run that never learns); that is refused here too.
    """
    import torch

    factory = _factory_of(node, torch.optim.Optimizer)
    if factory is None:
        return
    cls, kwargs = factory
    lr = kwargs.get("lr")
    if isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr <= 0:
        raise UserError(f"{_join(path, 'lr')}={lr!r}: expected a learning rate > 0")
    try:
        cls([torch.nn.Parameter(torch.zeros(1))], **kwargs)
    except (ValueError, TypeError) as err:
        # torch names the value, not the argument ("Invalid momentum value: -0.9"): find it.
        key = next(
            (k for k, v in kwargs.items() if repr(v) in str(err) or str(v) in str(err)), None
        )
        where = f"{_join(path, key)}={kwargs[key]!r}" if key else path
        raise UserError(f"{where}: {err} (from {node._target_})") from None


def _factory_of(node: DictConfig, base: type) -> tuple[type, dict[str, Any]] | None:
    """(class, its arguments) of a `_partial_` node whose target is a subclass of `base`."""
    if not node.get("_partial_", False):
        return None
    cls = get_object(node._target_)
    if not (inspect.isclass(cls) and issubclass(cls, base)):
        return None
    args = cast(dict[str, Any], OmegaConf.to_container(node, resolve=True))  # node is a DictConfig
    return cls, {k: v for k, v in args.items() if k not in _SPECIAL_KEYS}


# What the task fills in when it builds a scheduler factory (models/optim_plan.py), for one
# built here on a stand-in optimizer: a short run's length and the optimizer's lr as the peak.
_SCHEDULER_STAND_INS: dict[str, Any] = {"T_max": 10, "total_steps": 10, "max_lr": 1.0}


def _check_scheduler(node: DictConfig, path: str) -> None:
    """Build a scheduler factory on a stand-in optimizer and step it through a short run: its
    range checks (warmup_steps=-1, ...) then fail now, naming the override, and a schedule that
    sets a negative or non-finite lr (eta_min=-1: gradient ascent) is refused before a run that
    climbs its loss."""
    import torch

    sched = torch.optim.lr_scheduler
    factory = _factory_of(node, sched.LRScheduler)
    if factory is None:
        return
    cls, kwargs = factory
    takes = inspect.signature(cls).parameters
    stand_ins = {k: v for k, v in _SCHEDULER_STAND_INS.items() if k in takes and k not in kwargs}
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0, momentum=0.9)
    try:
        scheduler = cls(optimizer, **stand_ins, **kwargs)
        lrs = list(scheduler.get_last_lr())
        for _ in range(9 if not isinstance(scheduler, sched.ReduceLROnPlateau) else 0):
            optimizer.step()
            scheduler.step()
            lrs += scheduler.get_last_lr()
    except ConfigError as err:
        raise err.at(path) from None
    except TypeError:
        return  # an argument only the task can give: built, and checked, in the run
    except (ValueError, ArithmeticError) as err:  # OneCycleLR's div_factor=0: 1 / 0
        key = next((k for k, v in kwargs.items() if str(v) in str(err)), None)
        if isinstance(err, ArithmeticError):
            key = next((k for k, v in kwargs.items() if v == 0 and k in takes), key)
            err = ValueError("expected a number other than 0 (the schedule divides by it)")
        where = f"{_join(path, key)}={kwargs[key]!r}" if key else path
        raise UserError(f"{where}: {err} (from {node._target_})") from None
    bad = next((lr for lr in lrs if not (math.isfinite(lr) and lr >= 0)), None)
    if bad is not None:
        shown = ", ".join(f"{_join(path, k)}={v!r}" for k, v in kwargs.items())
        raise UserError(f"{shown}: sets an lr of 1 to {bad:.3g} within a 10-step run; "
                        "expected a schedule whose lr stays >= 0 and finite")  # fmt: skip


def _without_domain(annotation: Any) -> Any:
    """`Annotated[int, AtLeast(1)]` -> int: the type, checked before the domain."""
    return annotation.__origin__ if typing.get_origin(annotation) is Annotated else annotation


def _matches(value: Any, ann: Any) -> bool:
    ann = _without_domain(ann)
    if ann in (inspect.Parameter.empty, Any) or isinstance(ann, (str, typing.TypeVar)):
        return True
    origin = typing.get_origin(ann)
    if is_union(ann):
        return any(_matches(value, a) for a in typing.get_args(ann))
    if origin is Literal:  # precision=True is not precision=1 (Choice compares types too)
        return Choice(typing.get_args(ann)).admits(value)
    if ann is type(None) or ann is None:
        return value is None
    if ann is bool:
        return isinstance(value, bool)
    if ann is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if ann is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if ann is str:
        return isinstance(value, str)
    container = origin or ann
    if container in _SEQUENCES:
        if not isinstance(value, (list, tuple)):
            return False
        args = typing.get_args(ann)
        if container is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(map(_matches, value, args))
        return not args or all(_matches(v, args[0]) for v in value)
    if container in _MAPPINGS:
        return isinstance(value, dict)
    if isinstance(container, type):
        return isinstance(value, container)
    return True  # Callable, Protocol, ...: not checkable from a plain value


def _describe(ann: Any) -> str:
    choices: list[str] = []
    kinds: list[str] = []

    def collect(a: Any) -> None:
        a = _without_domain(a)
        if is_union(a):
            for arg in typing.get_args(a):
                collect(arg)
        elif typing.get_origin(a) is Literal:
            choices.extend(repr(v) for v in typing.get_args(a))
        elif a is type(None) or a is None:
            kinds.append("null")
        elif a is bool:
            kinds.append("true or false")
        else:
            name = getattr(a, "__name__", None) or str(a).replace("typing.", "")
            if typing.get_origin(a) is not None:
                name = str(a).replace("typing.", "").replace("collections.abc.", "")
            kinds.append(name)

    collect(ann)
    parts = ([f"one of {', '.join(choices)}"] if choices else []) + kinds
    return " or ".join(parts)
