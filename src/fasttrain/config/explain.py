"""Hydra's composition errors as one line naming the override and what is valid (Hydra's own
say it in several lines and a config search path): an unknown key with the closest valid one,
a group option that does not exist, a + on a key that exists, an override Hydra's grammar cannot
parse with the quoting that would make it parse. Used by fasttrain.config.overrides."""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Callable, Sequence
from typing import Any

# Keys an entry point no longer has, and what replaced them.
RENAMED = {"train": {"ckpt_path": "resume=PATH"}}
_SHOWN = 12  # at most this many valid keys in a message
KeysAt = Callable[[str, list[str]], list[str]]


def explain(err: Exception, config_name: str, overrides: list[str], keys_at: KeysAt) -> str:
    """One line for a Hydra composition error. `keys_at(parent, overrides)`: the keys of the node
    at `parent` in the config those overrides compose (to suggest the closest one)."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(err, OverrideParseException):
        return bad_syntax(overrides) or first_line(err)
    if isinstance(err, MissingConfigException) and err.options is not None:
        group, _, name = str(err.missing_cfg_file).rpartition("/")
        return f"{group}={name}: no such option in {group}/{_suggest(name, err.options, '')}"
    # Hydra's errors carry the key only in their text; tests/test_bad_input.py has a case for
    # each pattern below, so a changed message fails there instead of printing Hydra's lines.
    text = str(err)
    if match := re.match(r"Could not override '([^']+)'", text):
        return _unknown_key(match.group(1), config_name, overrides, keys_at)
    if match := re.match(r"Could not append to config\. An item is already at '([^']+)'", text):
        key = match.group(1)
        return f"+{key}: {key} already exists; set it without the +, as {key}=VALUE"
    if match := re.search(r"Could not (?:delete|find) .*?'([^']+)'", text):
        return f"{match.group(1)}: {first_line(err)}"
    return first_line(err)


def _unknown_key(key: str, config_name: str, overrides: list[str], keys_at: KeysAt) -> str:
    override = next((o for o in overrides if o.split("=", 1)[0].lstrip("~+") == key), key)
    renamed = RENAMED.get(config_name, {}).get(key)
    if renamed:
        return f"{override}: no such key; use {renamed} instead"
    parent, _, leaf = key.rpartition(".")
    keys = keys_at(parent, [o for o in overrides if o != override])
    keys = [k for k in keys if not k.startswith("_")]  # _target_ and co. are not settings
    hint = _suggest(leaf, keys, f"{parent}." if parent else "") if keys else ""
    if "did you mean" in hint:
        return f"{override}: no such key{hint}"
    return f"{override}: no such key{hint} (a new key needs a +: +{override.lstrip('+')})"


def _suggest(name: str, valid: Sequence[str], prefix: str) -> str:
    close = difflib.get_close_matches(name, valid, n=1)
    shown = ", ".join(list(valid)[:_SHOWN]) + (", ..." if len(valid) > _SHOWN else "")
    mean = f"did you mean {prefix}{close[0]}? " if close else ""
    return f"; {mean}valid: {shown}"


def bad_syntax(overrides: list[str]) -> str | None:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_override(override)
        except HydraException as err:
            quoted = _quoted(override)
            if quoted is not None and _parses(parser, quoted):
                # Hydra's grammar takes non-ASCII letters and most symbols only inside quotes
                how = f"quote the value as Hydra's grammar needs: {shlex.quote(quoted)}"
            else:
                how = "write key=value, quoting values with spaces or brackets: 'key=\"a b\"'"
            return f"{override}: not a valid override ({first_line(err)}); {how}"
    return None


def _quoted(override: str) -> str | None:
    """`override` with its value (or each item of a [list] value) in double quotes:
    tags=[héllo,b] -> tags=["héllo","b"]; None where it holds no plain key=value."""
    key, eq, value = override.partition("=")
    if not eq or not value or '"' in value or "'" in value:
        return None
    if value.startswith("[") and value.endswith("]"):
        items = value[1:-1].split(",")
        return f"{key}=[{','.join(_in_quotes(item.strip()) for item in items)}]"
    return f"{key}={_in_quotes(value)}"


def _in_quotes(text: str) -> str:
    return '"' + text.replace("\\", "\\\\") + '"'


def _parses(parser: Any, override: str) -> bool:
    from hydra.errors import HydraException

    try:
        parser.parse_override(override)
    except HydraException:
        return False
    return True


def first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
