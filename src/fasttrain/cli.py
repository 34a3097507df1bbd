"""Every entry point goes through `entry(config_name, task)`: a fast `--help`, the command line
checked before Hydra writes anything, the task run inside Hydra, and the exit codes:
0 done, 1 a crash (traceback), 2 bad input (one `error:` line, nothing written or lost).

    python train.py ...                 entry("train", tasks.train)
    python -m fasttrain.evaluate ...    entry("eval", tasks.evaluate)   (export, predict alike)

The `--help` here lists the groups from conf/ and composes once: Hydra's own help copies its
config repository once per group it lists (~0.6 s more on a 2-core machine).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from fasttrain import CONFIG_DIR
from fasttrain.config.errors import UserError

T = TypeVar("T")

# Exit code for bad input, distinct from 1 (a crash) so scripts can tell them apart.
USER_ERROR_EXIT = 2


def entry(config_name: str, task: Callable[[Any], Any]) -> None:
    """Run `task(cfg)` on conf/<config_name>.yaml composed with the command line."""
    argv = sys.argv[1:]
    if wants_app_help(argv):
        print_app_help(config_name, argv)
        return
    import hydra

    from fasttrain.config.overrides import check_command_line
    from fasttrain.distributed.multirun import rank_argv

    sys.argv[1:] = argv = rank_argv(argv)  # a DDP rank of a sweep job: that job only
    run_task(check_command_line, config_name, argv)  # bad overrides: one line, nothing written

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=config_name)
    def hydra_main(cfg: Any) -> float | None:
        from hydra.core.hydra_config import HydraConfig

        run_dirs = (HydraConfig.get().runtime.output_dir, cfg.paths.log_dir)
        result = run_task(task, cfg, run_dirs=run_dirs)
        # What a sweeper (hparams_search=optuna) optimises; the finished run's files are kept.
        return run_task(optimized_metric, result, cfg.get("optimized_metric"))

    hydra_main()


def optimized_metric(result: Any, name: str | None) -> float | None:
    """The value of `name` among a run's final metrics; None when no metric is optimised. A
    misspelt name fails loudly: a sweeper would otherwise compare Nones."""
    if name is None or not isinstance(result, Mapping):
        return None
    if name not in result:
        logged = ", ".join(sorted(result)) or "none"
        raise UserError(f"optimized_metric={name!r}: the run never logged it; logged: {logged}")
    return float(result[name])


def show_tracebacks() -> bool:
    # Same switch Hydra uses, so one variable shows the full trace everywhere.
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def discard_run_dir(output_dir: str | Path, log_dir: str | Path) -> None:
    """Remove what Hydra wrote for a run that never started (its .hydra/ and log file).

    Only files Hydra itself creates are removed, and folders only while they are empty, up to
    (not including) `log_dir`, so a resumed run's checkpoints can never be lost here.
    """
    out, stop = Path(output_dir).resolve(), Path(log_dir).resolve()
    if stop not in out.parents:
        return
    shutil.rmtree(out / ".hydra", ignore_errors=True)
    for log in out.glob("*.log"):
        log.unlink(missing_ok=True)
    folder = out
    while folder != stop:
        try:
            folder.rmdir()  # fails (and stops) at the first non-empty folder
        except OSError:
            break
        folder = folder.parent


def run_task(task: Callable[..., T], *args: Any, run_dirs: tuple[str, str] | None = None) -> T:
    """Run an entry point's task; turn a UserError into one line on stderr and exit code 2.

    `run_dirs` is (output_dir, log_dir) of a Hydra run, discarded when the task fails on input.
    """
    try:
        return task(*args)
    except UserError as err:
        if show_tracebacks():
            raise
        if run_dirs is not None:
            discard_run_dir(*run_dirs)
        print(f"error: {err}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)


# Flags that must keep Hydra's own behaviour (its help about Hydra itself, shell completion...).
_HYDRA_FLAGS = (
    "--hydra-help",
    "--cfg",
    "-c",
    "--info",
    "--shell-completion",
    "-sc",
    "--run",
    "-m",
    "--multirun",
)


def wants_app_help(argv: list[str]) -> bool:
    return "--help" in argv or ("-h" in argv and not any(a in _HYDRA_FLAGS for a in argv))


def config_groups(root: Path = Path(CONFIG_DIR)) -> dict[str, list[str]]:
    """{"model/net": ["mlp", "small_cnn"], ...}: each folder with YAML files is a group."""
    groups: dict[str, list[str]] = {}
    for file in sorted(root.rglob("*.yaml")):
        group = file.parent.relative_to(root).as_posix()
        if group != "." and group != "hydra":
            groups.setdefault(group, []).append(file.stem)
    return groups


def print_app_help(config_name: str, argv: list[str]) -> None:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    overrides = [a for a in argv if not a.startswith("-")]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name, overrides=overrides)
    entry = Path(sys.argv[0]).name
    lines = [f"{entry}: fasttrain, configured by Hydra.", "", "== Configuration groups ==",
             "Compose your configuration from those groups (group=option)", ""]  # fmt: skip
    lines += [f"{group}: {', '.join(opts)}" for group, opts in config_groups().items()]
    lines += ["", "== Config ==", "Override anything in the config (foo.bar=value)", ""]
    lines.append(OmegaConf.to_yaml(cfg))
    lines.append("Hydra's own options: --hydra-help")
    print("\n".join(lines))
