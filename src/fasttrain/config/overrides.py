"""Check the command line before Hydra starts a run: one line per mistake, nothing written.

Hydra reports a bad override in several lines (`Could not override 'x'. To append to your
config use +x=...`, a config search path, ...) and exits 1. Composing the same overrides here
first turns each kind of mistake into one UserError naming the override and what is valid:

    trainer.max_epoch=3: no such key; did you mean trainer.max_epochs?
    trainer=foo: no such option in trainer/; valid: cpu, ddp, ddp_cpu, default, dp, fsdp, gpu

and then validates the composed config against the signatures (fasttrain.config.schema), so a wrong
type or an unknown argument fails before Hydra creates or overwrites a run folder.

A sweep (`-m seed=1,2 data.batch_size=0,64`, or a config that sets `hydra.mode: MULTIRUN` such
as hparams_search=optuna) is checked job by job: every combination of the swept values when
there are few, otherwise enough combinations that each value is checked once, before Hydra
writes the sweep folder. `--cfg job` and other flags that print instead of running are checked
the same way; the flags that change where configs come from (--config-path, --config-dir) or
only ask Hydra something (--info, --hydra-help, --shell-completion) are left to Hydra.
"""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from fasttrain.config.errors import UserError
from fasttrain.config.project import CONFIG_DIR

# Up to this many jobs a sweep is checked combination by combination; beyond, each value once.
_FULL_GRID = 8
# A range sweep longer than this is checked at its ends (and middle) only.
_LONG_RANGE = 16


@dataclass
class Checked:
    """What Hydra is about to do with a command line that passed the checks.

    `jobs` holds the composed config of each job checked (the hydra node removed; one for a run,
    the checked combinations for a sweep, none when Hydra answers a flag itself). `run_dir` is
    the folder of a single run, resolved exactly as Hydra will (None for a sweep or a command
    that only prints); `pin` the overrides that keep Hydra on that folder (see `_pin`);
    `prints_only` a command that prints its config (--cfg) and builds nothing, so needs no data.
    For a single run, `run` is its whole config (Hydra's node included, `pin` applied), composed
    as @hydra.main composes it, and `hydra` the Hydra instance that composed it: the run goes on
    with both (fasttrain.cli.run_checked) instead of Hydra composing the command line again.
    """

    jobs: list[Any] = field(default_factory=list)
    run_dir: Path | None = None
    pin: list[str] = field(default_factory=list)
    prints_only: bool = False
    run: Any = None
    hydra: Any = None


def check_command_line(config_name: str, argv: list[str]) -> Checked:
    """Compose `argv` as Hydra will and validate each job; raise UserError on the first mistake."""
    flags = _hydra_flags(argv)
    if flags is None or _left_to_hydra(flags):
        return Checked()
    with main_hydra() as hydra:
        checked = _check(config_name, argv, flags)
    if checked.run is not None:
        checked.hydra = hydra
    return checked


# What @hydra.main in fasttrain.cli (the entry points' task function) sets up: its module names
# the job (hydra.job.name) and the search path starts from conf/.
_HYDRA_MAIN_MODULE = "fasttrain.cli"


@contextlib.contextmanager
def main_hydra() -> Any:
    """The Hydra instance @hydra.main would create for the entry points, as the global one for
    the block (the one before it, if any, is restored after)."""
    # Private: Hydra has no public way to set up its main instance (hydra.main does this);
    # tests/test_train_cli.py fails loudly if these move.
    from hydra import version
    from hydra._internal.hydra import Hydra
    from hydra._internal.utils import create_automatic_config_search_path, detect_task_name
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.singleton import Singleton

    version.setbase("1.3")
    backup = Singleton._instances.pop(GlobalHydra, None)
    try:
        search = create_automatic_config_search_path(None, _HYDRA_MAIN_MODULE, CONFIG_DIR)
        name = detect_task_name(None, _HYDRA_MAIN_MODULE)
        yield Hydra.create_main_hydra2(task_name=name, config_search_path=search)
    finally:
        Singleton._instances.pop(GlobalHydra, None)
        if backup is not None:
            Singleton._instances[GlobalHydra] = backup


def _check(config_name: str, argv: list[str], flags: Any) -> Checked:
    config_name = flags.config_name or config_name
    overrides: list[str] = list(flags.overrides or [])
    parsed = _parse(overrides)
    refuse_secrets(parsed)
    sweeps = [o for o in parsed if o.is_sweep_override()]
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    first = [*fixed, *(f"{o.get_key_element()}={_values(o)[0]}" for o in sweeps if _values(o))]
    # --cfg prints the composed config: values are not resolved or checked (a resolver may read
    # the data, e.g. an image folder's class count), only the composition is.
    cfg = _check_job(config_name, first, overrides, multirun=bool(flags.multirun or sweeps),
                     values=flags.cfg is None)  # fmt: skip
    mode = OmegaConf.select(cfg, "hydra.mode", default=None)
    multirun = bool(flags.multirun) or (str(mode).endswith("MULTIRUN") and not flags.run)
    if sweeps and not multirun:
        bad = sweeps[0].input_line
        raise UserError(
            f"{bad}: several values sweep only with -m (python {Path(sys.argv[0]).name} -m "
            f"{bad}); a list is written key=[a,b], a text with a comma quoted: key='a,b'"
        )
    if not multirun:
        if flags.cfg is not None:  # --cfg job|hydra|all: Hydra prints the config, runs nothing
            return Checked([_without_hydra(cfg)], prints_only=True)
        pin = _pin(cfg, parsed)
        _as_hydra_runs(cfg, pin)
        run_dir = Path(str(cfg.hydra.runtime.output_dir))
        return Checked([_without_hydra(cfg)], run_dir, pin, run=cfg)
    _one_folder_per_job(parsed)
    jobs = [_without_hydra(cfg)]
    for combination in _combinations(fixed, _sweep_dims(sweeps, cfg, parsed)):
        if combination != first:
            jobs.append(_without_hydra(_check_job(config_name, combination, overrides, True)))
    return Checked(jobs)


# A credential given as an override would be written to .hydra/, the trackers and checkpoints.
_SECRET_KEY = re.compile(r"(api_key|password|token|secret)$", re.I)
_SECRET_VALUE = re.compile(r"[0-9a-f]{40}|[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@.*", re.I)


def refuse_secrets(parsed: list[Any]) -> None:
    """UserError for an override whose key names a secret or whose value is one (a W&B key's
    40 hex digits, a URI with user:password@), before anything records the command line."""
    for override in parsed:
        value = override.input_line.partition("=")[2].strip("'\"")
        named = _SECRET_KEY.search(override.key_or_group) and value not in ("", "null")
        if named or _SECRET_VALUE.fullmatch(value):
            raise UserError(
                f"{override.input_line}: a secret given on the command line would be saved in "
                ".hydra/config.yaml, the tracker's params and every checkpoint; put it in the "
                "environment or .env (see .env.example)"
            )


def _hydra_flags(argv: list[str]) -> Any:
    """Hydra's own reading of the command line (flags and overrides); None if Hydra would
    reject the flags (it then says why itself)."""
    # Private: Hydra has no public parser for its command line (hydra.main uses this one);
    # tests/test_reliability_run_sweeps.py fails loudly if it moves.
    from hydra._internal.utils import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            return get_args_parser().parse_args(argv)
    except SystemExit:
        return None


def _left_to_hydra(flags: Any) -> bool:
    """Flags that take configs from elsewhere or only ask Hydra something: its business."""
    return bool(
        flags.config_path or flags.config_dir or flags.info or flags.hydra_help
        or flags.shell_completion or flags.experimental_rerun or flags.help
    )  # fmt: skip


def _parse(overrides: list[str]) -> list[Any]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        return list(OverridesParser.create().parse_overrides(overrides))
    except HydraException as err:
        from fasttrain.config.explain import bad_syntax, first_line

        raise UserError(bad_syntax(overrides) or first_line(err)) from None


def _check_job(config_name: str, overrides: list[str], argv: list[str], multirun: bool,
               values: bool = True) -> Any:  # fmt: skip
    """The composed config of one job (hydra node included), validated (its `values` too)."""
    from hydra.errors import HydraException

    try:
        cfg = _compose(config_name, overrides, hydra=True)
    except HydraException as err:
        keys_at = functools.partial(_keys_at, config_name)
        from fasttrain.config.explain import explain

        raise UserError(explain(err, config_name, argv, keys_at)) from None
    _as_in_a_run(cfg, multirun)
    if not values:
        return cfg
    from fasttrain.config.schema import validate

    validate(_without_hydra(cfg), entry=config_name)
    return cfg


def _without_hydra(cfg: Any) -> Any:
    """A job's own config, as the task receives it (Hydra's node left out)."""
    return OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"])


def _values(override: Any) -> list[str]:
    """The values a sweep override stands for, as override strings (an interval: its ends)."""
    from hydra.core.override_parser.types import IntervalSweep
    from hydra.errors import HydraException

    if override.is_interval_sweep():
        sweep = override.value()
        assert isinstance(sweep, IntervalSweep)
        return [str(sweep.start), str(sweep.end)]
    try:
        values = list(itertools.islice(override.sweep_string_iterator(), 1000))
    except HydraException:  # a glob over a group's options: Hydra expands it
        return []
    if override.is_range_sweep() and len(values) > _LONG_RANGE:
        values = [values[0], values[len(values) // 2], values[-1]]
    return values


def _sweep_dims(sweeps: list[Any], cfg: Any, parsed: list[Any]) -> list[tuple[str, list[str]]]:
    """(key, values) of each swept key: the command line's, then the sweeper's `params` (e.g.
    hparams_search=optuna) for keys the command line does not set."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    given = {o.key_or_group for o in parsed}
    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None) or {}
    parser = OverridesParser.create()
    from_config = [parser.parse_override(f"{k}={v}") for k, v in params.items() if k not in given]
    dims = [(o.get_key_element(), _values(o)) for o in [*sweeps, *from_config]]
    return [(key, values) for key, values in dims if values]


def _combinations(fixed: list[str], dims: list[tuple[str, list[str]]]) -> list[list[str]]:
    """The jobs to check: the whole grid when small, else rows that use each value once."""
    if not dims:
        return []
    keys, value_lists = zip(*dims, strict=True)
    total = 1
    for values in value_lists:
        total *= len(values)
    if total <= _FULL_GRID:
        rows = list(itertools.product(*value_lists))
    else:
        rows = [tuple(v[i % len(v)] for v in value_lists)
                for i in range(max(map(len, value_lists)))]  # fmt: skip
    return [[*fixed, *(f"{k}={v}" for k, v in zip(keys, row, strict=True))] for row in rows]


def _pin(cfg: Any, parsed: list[Any]) -> list[str]:
    """The override that makes Hydra use the folder checked here, unless a given run_name
    names it already. The default run name holds the time (`${now:...}`), which Hydra would
    read again a moment later: a second may pass. A hydra.* override, so it is recorded in
    .hydra/hydra.yaml and the run's overrides.yaml stays what was typed."""
    keys = {o.key_or_group for o in parsed}
    if "paths.output_dir" in keys and "hydra.run.dir" not in keys:
        # The folder named is the run's: its lock, .hydra/ and log go there too, not into a
        # second folder under logs/ that no lock of the named one would guard. (Its value was
        # checked with the paths group: fasttrain.config.settings.paths.)
        folder = os.path.abspath(str(cfg.paths.output_dir))
        _as_in_a_run_at(cfg, folder)
        return [f"hydra.run.dir={quote(folder)}"]
    if "run_name" in keys and "hydra.run.dir" not in keys:
        return []
    return [f"hydra.run.dir={quote(str(cfg.hydra.runtime.output_dir))}"]


def _one_folder_per_job(parsed: list[Any]) -> None:
    """A sweep whose jobs would all write into one paths.output_dir (each job's checkpoints over
    the one before's) is refused; one that varies per job is not."""
    for o in parsed:
        fixed = o.key_or_group == "paths.output_dir" and not o.is_sweep_override()
        if fixed and "${" not in o.input_line:
            raise UserError(
                f"{o.input_line}: every job of the sweep would write its checkpoints and "
                "metrics into this one folder; leave it out (each job gets its own under "
                "hydra.sweep.dir) or make it differ per job: "
                f"paths.output_dir='{o.value()}/${{hydra:job.num}}'"
            )


def _as_hydra_runs(cfg: Any, pin: list[str]) -> None:
    """`cfg` as Hydra's run would compose it from the command line and `pin`: the pin's value
    set and recorded among the hydra overrides (.hydra/hydra.yaml), then `hydra.mode=RUN`, which
    Hydra adds where no config sets a mode."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode
    from omegaconf import open_dict, read_write

    parser = OverridesParser.create()
    with read_write(cfg.hydra), open_dict(cfg.hydra):
        for override in pin:
            cfg.hydra.run.dir = parser.parse_override(override).value()
            cfg.hydra.overrides.hydra.append(override)
        if cfg.hydra.mode is None:
            cfg.hydra.mode = RunMode.RUN
            cfg.hydra.overrides.hydra.append("hydra.mode=RUN")


def pin_run_name(job: Any) -> None:
    """Read the run's name once, as its folder's path under logs/<task_name>/ (a sweep job's is
    multirun/<time>/<job>). The default name holds the time (`${now:...}`), which each later
    read would take again: MLflow and W&B, starting a minute on, named the run otherwise than
    its folder and TensorBoard did."""
    if "run_name" not in job or "paths" not in job:
        return
    home = Path(str(job.paths.log_dir)) / str(job.task_name)
    try:
        job.run_name = Path(str(job.paths.output_dir)).relative_to(home).as_posix()
    except ValueError:  # hydra.run.dir moved elsewhere: the name as configured, read once
        job.run_name = str(job.run_name)


def quote(value: str) -> str:
    """`value` as one Hydra override value, taken literally (`=`, `,`, spaces...): in single
    quotes, where a backslash is an escape only before a quote (or the closing one)."""
    if not re.search(r"[\\\s=,:'\"()\[\]{}$]", value):
        return value
    value = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value)
    return "'" + value.replace("'", "\\'") + "'"


def _compose(config_name: str, overrides: list[str], hydra: bool = False) -> Any:
    from hydra import compose

    with contextlib.ExitStack() as stack:
        from hydra.core.global_hydra import GlobalHydra

        if not GlobalHydra.instance().is_initialized():  # called outside check_command_line
            stack.enter_context(main_hydra())
        return compose(config_name, overrides=overrides, return_hydra_config=hydra)


def _as_in_a_run(cfg: Any, multirun: bool = False) -> None:
    """Fill what Hydra fills when a job starts, so `${hydra:runtime.*}` values resolve."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    with open_dict(cfg):
        cfg.hydra.runtime.cwd = os.getcwd()
    # The run dir may itself need the launch folder (paths.root_dir): set that first.
    HydraConfig.instance().set_config(cfg)
    # A sweep's jobs live below its folder; which one does not matter for the checks.
    run_dir = os.path.abspath(str(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir))
    _as_in_a_run_at(cfg, run_dir)


def _as_in_a_run_at(cfg: Any, run_dir: str) -> None:
    """`${hydra:runtime.output_dir}` is `run_dir`, as in the run Hydra starts there."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict, read_write

    with read_write(cfg.hydra), open_dict(cfg.hydra):
        cfg.hydra.runtime.output_dir = run_dir
    HydraConfig.instance().set_config(cfg)


def _keys_at(config_name: str, parent: str, overrides: list[str]) -> list[str]:
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
