"""Value domains, declared where an argument is declared:

    def __init__(self, lr: Annotated[float, Positive] = 1e-3,
                 num_workers: Annotated[int, AtLeast(0)] = 0,
                 dropout: Annotated[float, Probability] = 0.1) -> None:
        check_arguments(MyNet.__init__, locals())  # the same rules when built in Python

The config check (fasttrain.config.schema) reads them from the signature and refuses a value
outside its domain in one line naming the override and the domain (`data.batch_size=0: expected
an int >= 1`), before anything is built or written. A number's domain holds finite numbers only
(nan and inf are outside every one). Rules across values (fractions that leave no training row)
stay hand-written, with the component they constrain.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Any, Literal, TypeVar

from fasttrain.config.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class Range:
    """The numbers from `low` to `high` (None: unbounded), each end open or closed. `what` names
    the value in the message ("a probability"; default "an int" or "a number"), `note` follows
    the range ("0: the most likely token"), and `null` is what null means where it is allowed
    ("every token"; "" just says "or null"); `empty`: an empty list is admitted too."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    what: str = ""
    note: str = ""
    null: str = ""
    empty: bool = False  # an empty list is admitted too (a list-typed argument's)

    def holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def says(self, kind: type, nullable: bool, value: Any = None) -> str:
        """ "expected an int >= 1", "expected a probability in [0, 1)", "..., or null (all)"."""
        what = self.what or ("an int" if kind is int else "a number")
        if isinstance(value, float) and not math.isfinite(value):
            what = "a finite number"  # nan, inf: said as such, whatever the value's name
        lo, hi = (None if b is None else _number(b) for b in (self.low, self.high))
        if lo is not None and hi is not None:
            if kind is int and not (self.low_open or self.high_open):
                shown = f"from {lo} to {hi}"
            elif self.low_open and self.high_open:
                shown = f"strictly between {lo} and {hi}"
            else:
                shown = (
                    f"in {'(' if self.low_open else '['}{lo}, {hi}{')' if self.high_open else ']'}"
                )
        elif lo is not None:
            shown = f"{'>' if self.low_open else '>='} {lo}"
        else:
            shown = f"{'<' if self.high_open else '<='} {hi}" if hi is not None else ""
        text = f"expected {what} {shown}".rstrip()
        text += f" ({self.note})" if self.note else ""
        if nullable:
            text += f", or null ({self.null})" if self.null else " or null"
        return text


def _number(bound: float) -> str:
    """4294967295 as such, 0.5 as 0.5, 1.0 as 1."""
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


Positive = Range(0, low_open=True)
NonNegative = Range(0)
LearningRate = Range(0, low_open=True, what="a learning rate")
Probability = Range(0, 1, high_open=True, what="a probability")
OpenUnit = Range(0, 1, low_open=True, high_open=True)  # a fraction that leaves some of both


# An input shape without the batch axis: [features] or [channels, height, width].
Shape = Annotated[Sequence[int], Range(1, what="a non-empty list of ints")]


def AtLeast(low: float, what: str = "", note: str = "", null: str = "") -> Range:
    """`Annotated[int, AtLeast(1)]`: named as it reads, like a type."""
    return Range(low, what=what, note=note, null=null)


@dataclass(frozen=True)
class Domain:
    """What an annotation declares: its range, its number type, whether null is allowed, and
    the values of a Literal beside it (`Annotated[int, AtLeast(0)] | Literal["auto"]`)."""

    range: Range
    kind: type
    nullable: bool
    listed: bool  # a list of such numbers (not empty) is admitted too
    choices: tuple[Any, ...] = ()  # the values of a Literal beside it ("auto"), admitted as such
    text: bool = False  # a plain `str` beside it: any text is the component's to read

    def admits(self, value: Any) -> bool:
        if isinstance(value, str):
            return self.text or value in self.choices
        if isinstance(value, Sequence) and not isinstance(value, str):  # a ListConfig too
            some = bool(value) or self.range.empty
            return self.listed and some and all(map(self._holds, value))
        return (value is None and self.nullable) or self._holds(value)

    def _holds(self, value: Any) -> bool:
        # An int's domain holds ints only: 2.5 blocks or workers, built in Python, are refused
        # here as the config check's type check refuses them.
        return self.range.holds(value) and (self.kind is float or isinstance(value, int))

    def says(self, value: Any = None) -> str:
        text = self.range.says(self.kind, self.nullable, value)
        return text + "".join(f" or {c!r}" for c in self.choices)


@dataclass(frozen=True)
class Folder:
    """A folder to write into, made if missing (`log_dir: Annotated[str, Folder()]`): not empty,
    no file at it or above it; where the annotation admits None, empty reads as null too. With
    `inside` ("logs/<task>/"): a folder's name under that one (relative, no `.`/`..` part)."""

    inside: str = ""
    nullable: bool = False

    def fault(self, value: Any) -> str | None:
        """What keeps `value` from being such a folder, or None."""
        if value is None or (self.nullable and value == ""):
            return None if self.nullable else "is empty"
        if not isinstance(value, str) or not value.strip():
            return "is empty"
        if self.inside:
            parts = PurePosixPath(value).parts
            if value.startswith("/") or any(p in (".", "..") for p in parts):
                return "is not"
            return "is too long" if any(len(p.encode()) > NAME_MAX for p in parts) else None
        folder = Path(value).expanduser()
        existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
        if existing is not None and not existing.is_dir():
            return "is a file" if existing == folder else f"lies under a file ({existing})"
        return None if existing in (None, folder) else _cannot_make(folder, existing)

    def admits(self, value: Any) -> bool:
        return self.fault(value) is None

    def says(self, value: Any = None) -> str:
        if self.inside:
            too_long = self.fault(value) == "is too long"
            return f"expected at most {NAME_MAX} bytes per folder" if too_long else (
                f"expected a folder name inside {self.inside}")  # fmt: skip
        null = " or null" if self.nullable else ""
        return f"{self.fault(value)}; expected a folder (made if missing){null}"


NAME_MAX = 255  # bytes in one file name on common file systems


def _cannot_make(folder: Path, existing: Path) -> str | None:
    """Why `folder` cannot be made below the folder `existing` (/proc, a read-only mount, no
    permission), found by making it: what was made is removed again, so nothing stays."""
    try:
        folder.mkdir(parents=True, exist_ok=True)  # made meanwhile by another run: fine
        return None
    except OSError as err:
        return f"cannot be made ({err.strerror})"
    finally:
        for made in (folder, *folder.parents):
            if made == existing:
                break
            with contextlib.suppress(OSError):
                made.rmdir()  # only an empty one: what this made


def path_rule_of(annotation: Any) -> Folder | None:
    """The Folder in `Annotated[str, Folder()]` (also `... | None`), nullable as the annotation
    says, or None."""
    declared = _declared(annotation, Folder)
    if declared is None:
        return None
    found, members, inner = declared
    return dataclasses.replace(found, nullable=type(None) in (*members, *inner))


def domain_of(annotation: Any) -> Domain | None:
    """The Range in `Annotated[int, Range]` (also inside `... | None`), or None."""
    declared = _declared(annotation, Range)
    if declared is None:
        return None
    found, members, inner = declared
    items = [a for m in inner if _is_sequence(m) for a in typing.get_args(m)]
    kind = int if {*inner, *items} & {int, float} == {int} else float
    choices = [a for m in members if typing.get_origin(m) is Literal for a in typing.get_args(m)]
    return Domain(found, kind, nullable=type(None) in (*members, *inner), listed=bool(items),
                  choices=tuple(choices), text=str in members)  # fmt: skip


def _declared(annotation: Any, rule: type[T]) -> tuple[T, tuple[Any, ...], tuple[Any, ...]] | None:
    """The first `rule` in the Annotated extras of `annotation` or of one of its union members,
    with those members and the members of the annotated type (`int | list[int]`)."""
    members = _members(annotation)
    for member in members:
        if typing.get_origin(member) is Annotated:
            base, *extras = typing.get_args(member)
            found = next((e for e in extras if isinstance(e, rule)), None)
            if found is not None:
                return found, members, _members(base)
    return None


def _members(annotation: Any) -> tuple[Any, ...]:
    return typing.get_args(annotation) if is_union(annotation) else (annotation,)


def _is_sequence(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (list, tuple, Sequence)


def is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


@dataclass(frozen=True)
class Choice:
    """What a Literal or a bool annotation declares (`crop: Literal["none", "pad"]`, also
    beside None or bool): the values admitted, compared with their type (True is not 1)."""

    values: tuple[Any, ...]

    def admits(self, value: Any) -> bool:
        return any(value == v and type(value) is type(v) for v in self.values)

    def says(self, value: Any = None) -> str:
        if self.values == (True, False):
            return "expected true or false"
        return f"expected one of {', '.join(map(_yaml, self.values))}"


def _yaml(value: Any) -> str:
    """A choice as a config spells it: 'epoch', true, null (1 stays 1: True == 1 in Python)."""
    if value is None or isinstance(value, bool):
        return "null" if value is None else str(value).lower()
    return repr(value)


def choice_of(annotation: Any) -> Choice | None:
    """The values of `Literal[...]` (also `Literal[...] | None`, `bool | Literal["all"]`) or of
    `bool`, or None where the annotation admits anything else."""
    members = _members(annotation)
    values: list[Any] = []
    for member in members:
        if typing.get_origin(member) is Literal:
            values.extend(typing.get_args(member))
        elif member is type(None):
            values.append(None)
        elif member is bool:
            values.extend((True, False))
        else:
            return None
    return Choice(tuple(values))


@functools.cache
def rules(func: Callable[..., Any]) -> dict[str, Domain | Choice | Folder]:
    """Each argument of `func` with a declared domain or a Literal's choices, in order."""
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception:  # a name only imported under TYPE_CHECKING: no rule is read from it
        return {}
    found = {name: rule_of(ann) for name, ann in hints.items()}
    return {name: rule for name, rule in found.items() if rule is not None}


def rule_of(annotation: Any) -> Domain | Choice | Folder | None:
    """The rule an annotation declares: a number's range, a path's, or a Literal's choices."""
    return domain_of(annotation) or path_rule_of(annotation) or choice_of(annotation)


def check_arguments(func: Callable[..., Any], values: Mapping[str, Any]) -> None:
    """ConfigError for the first of `values` (a call's `locals()`) outside its declared domain
    or its Literal's choices: the rules the config check applies, when built in Python."""
    for name, rule in rules(func).items():
        if name in values and not rule.admits(values[name]):
            raise ConfigError(name, values[name], rule.says(values[name]))
