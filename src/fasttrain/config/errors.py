"""User errors: what every check raises, so the entry skeleton (fasttrain.cli) prints one line."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class UserError(Exception):
    """A mistake in what the user asked for (config, paths, files), not a bug in the code."""


class DivergedError(FloatingPointError):
    """A run whose training diverged (a NaN/inf gradient, a non-finite validation or test
    loss): it has not trained, so it ends with one `diverged:` line and an exit code of its own
    (fasttrain.cli), never as a finished run."""


class ConfigError(UserError, ValueError):
    """A constructor argument with an invalid value.

    Components raise it with the argument's own name; the builder that instantiated the component
    prefixes the config path, so the user reads the exact override to fix:
    `data.batch_size=0: expected an int >= 1`.
    """

    def __init__(self, arg: str, value: Any, expected: str) -> None:
        self.arg, self.value, self.expected = arg, value, expected
        super().__init__(f"{arg}={value!r}: {expected}")

    def at(self, path: str) -> UserError:
        return UserError(f"{path}.{self.arg}={self.value!r}: {self.expected}")


def check_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    """An input shape (without the batch axis) as a tuple; ConfigError unless all ints >= 1."""
    shape = tuple(input_shape)
    if not shape or any(not isinstance(d, int) or d < 1 for d in shape):
        raise ConfigError("input_shape", list(shape), "expected a non-empty list of ints >= 1")
    return shape
