"""Check the command line before Hydra starts a run: one line per mistake, nothing written.

Hydra reports a bad override in several lines (`Could not override 'x'. To append to your
config use +x=...`, a config search path, ...) and exits 1. Composing the same overrides here
first turns each kind of mistake into one UserError naming the override and what is valid:

    trainer.max_epoch=3: no such key; did you mean trainer.max_epochs?
    trainer=foo: no such option in trainer/; valid: cpu, ddp, ddp_cpu, default, dp, fsdp, gpu

and then validates the composed config against the signatures (fasttrain.config.schema), so a wrong
type or an unknown argument fails before Hydra creates or overwrites a run folder.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Sequence
from typing import Any

from fasttrain import CONFIG_DIR
from fasttrain.config.errors import UserError

# Keys an entry point no longer has, and what replaced them.
RENAMED = {"train": {"ckpt_path": "resume=PATH"}}
_SHOWN = 12  # at most this many valid keys in a message


def check_command_line(config_name: str, argv: list[str]) -> None:
    """Compose `argv` as Hydra will and validate it; raise UserError on the first mistake.

    Flags (--cfg, -m/--multirun, --config-name, ...) are Hydra's business: then nothing is
    checked here and Hydra reports as usual.
    """
    if any(arg.startswith("-") for arg in argv):
        return
    from hydra.errors import HydraException
    from omegaconf import open_dict

    try:
        cfg = _compose(config_name, argv, hydra=True)
    except HydraException as err:
        raise UserError(explain(err, config_name, argv)) from None
    _as_in_a_run(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    from fasttrain.config.schema import validate

    validate(cfg, entry=config_name)


def _compose(config_name: str, overrides: list[str], hydra: bool = False) -> Any:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return compose(config_name, overrides=overrides, return_hydra_config=hydra)


def _as_in_a_run(cfg: Any) -> None:
    """Fill what Hydra fills when a run starts, so `${hydra:runtime.*}` values resolve."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict, read_write

    with open_dict(cfg):
        cfg.hydra.runtime.cwd = os.getcwd()
    # The run dir may itself need `${hydra:runtime.cwd}` (paths.root_dir): set that first.
    HydraConfig.instance().set_config(cfg)
    run_dir = cfg.hydra.run.dir
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.runtime.output_dir = run_dir
    HydraConfig.instance().set_config(cfg)


def explain(err: Exception, config_name: str, overrides: list[str]) -> str:
    """One line for a Hydra composition error."""
    from hydra.errors import MissingConfigException, OverrideParseException

    if isinstance(err, OverrideParseException):
        return _bad_syntax(overrides) or _first_line(err)
    if isinstance(err, MissingConfigException) and err.options is not None:
        group, _, name = str(err.missing_cfg_file).rpartition("/")
        return f"{group}={name}: no such option in {group}/{_suggest(name, err.options, '')}"
    text = str(err)
    if match := re.match(r"Could not override '([^']+)'", text):
        return _unknown_key(match.group(1), config_name, overrides)
    if match := re.match(r"Could not append to config\. An item is already at '([^']+)'", text):
        key = match.group(1)
        return f"+{key}: {key} already exists; set it without the +, as {key}=VALUE"
    if match := re.search(r"Could not (?:delete|find) .*?'([^']+)'", text):
        return f"{match.group(1)}: {_first_line(err)}"
    return _first_line(err)


def _unknown_key(key: str, config_name: str, overrides: list[str]) -> str:
    override = next((o for o in overrides if o.split("=", 1)[0].lstrip("~+") == key), key)
    renamed = RENAMED.get(config_name, {}).get(key)
    if renamed:
        return f"{override}: no such key; use {renamed} instead"
    parent, _, leaf = key.rpartition(".")
    keys = _keys_at(parent, config_name, [o for o in overrides if o != override])
    keys = [k for k in keys if not k.startswith("_")]  # _target_ and co. are not settings
    hint = _suggest(leaf, keys, f"{parent}." if parent else "") if keys else ""
    if "did you mean" in hint:
        return f"{override}: no such key{hint}"
    return f"{override}: no such key{hint} (a new key needs a +: +{override.lstrip('+')})"


def _keys_at(parent: str, config_name: str, overrides: list[str]) -> list[str]:
    """Keys of the node at `parent` in the config the other overrides compose (or the default)."""
    from omegaconf import DictConfig, OmegaConf

    for attempt in (overrides, []):
        try:
            cfg = _compose(config_name, attempt)
        except Exception:
            continue
        node = OmegaConf.select(cfg, parent) if parent else cfg
        return [str(k) for k in node] if isinstance(node, DictConfig) else []
    return []


def _suggest(name: str, valid: Sequence[str], prefix: str) -> str:
    close = difflib.get_close_matches(name, valid, n=1)
    shown = ", ".join(list(valid)[:_SHOWN]) + (", ..." if len(valid) > _SHOWN else "")
    mean = f"did you mean {prefix}{close[0]}? " if close else ""
    return f"; {mean}valid: {shown}"


def _bad_syntax(overrides: list[str]) -> str | None:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_override(override)
        except HydraException as err:
            return (
                f"{override}: not a valid override ({_first_line(err)}); "
                "write key=value, quoting values with spaces or brackets: 'key=\"a b\"'"
            )
    return None


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
