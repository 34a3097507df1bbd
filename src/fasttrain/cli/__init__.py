"""Every entry point goes through `entry(config_name, task)`: a fast `--help`, the command line
checked before Hydra writes anything, the run folder claimed, the task run inside Hydra, and the
exit codes: 0 done, 1 a crash (a traceback; a full disk: one `error:` line), 2 bad input (one
`error:` line, nothing written or lost), 3 diverged (one `diverged:` line: a NaN/inf gradient,
or a non-finite validation or test loss; the run folder keeps its last finite checkpoints),
143/130 stopped by SIGTERM/Ctrl-C (fasttrain.fit; Ctrl-C elsewhere: one `stopped by Ctrl-C`
line).

Before Hydra starts: every job's config is composed and checked (config/overrides.py) and
what it configures is built and thrown away (`construct_each`, cli/build.py), so a bad value
anywhere in a sweep is refused before the sweep folder exists. A single run then claims its
folder (`RunClaim`, cli/claim.py): a lock a second run with the same run_name respects, the
checks that could refuse to resume it, and, with resume=never, the old run moved aside; Hydra is
pinned to that folder.

    python train.py ...                 entry("train", tasks.train)
    python -m fasttrain.evaluate ...    entry("eval", tasks.evaluate)   (export, predict alike)

The `--help` here (cli/help.py) lists the groups from conf/ and composes once: Hydra's own help
copies its config repository once per group it lists (~0.6 s more on a 2-core machine).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import inspect
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from fasttrain.cli.build import (
    HeldLines,
    build_checked,
    construct_each,
    held_log_lines,
    one_log_stream,
)
from fasttrain.cli.claim import LOCK_FILE as LOCK_FILE  # tests import it from here
from fasttrain.cli.claim import RunClaim, claim_run_dir
from fasttrain.config.errors import DivergedError, UserError
from fasttrain.config.project import CONFIG_DIR, load_env_file, shown

T = TypeVar("T")
log = logging.getLogger(__name__)

# Exit code for bad input, distinct from 1 (a crash) so scripts can tell them apart.
USER_ERROR_EXIT = 2
# Exit code for a run that diverged (DivergedError): it ran, but has not trained.
DIVERGED_EXIT = 3
# Exit code for Ctrl-C (128 + SIGINT), as a shell reports a process it interrupted.
CTRL_C_EXIT = 130
# What a Ctrl-C outside fit's own handling (fasttrain.fit: it saves last.ckpt first) leaves.
INTERRUPTED = {
    "train": "the run folder keeps the checkpoints saved so far",
    "eval": "no metrics written",
    "export": "no file or report written (a format is moved into place only once checked)",
    "predict": "no predictions written",
}
_CTRL_C: list[int] = []  # the Ctrl-Cs the process (`script`) received


def _note_ctrl_c(signum: int, frame: Any) -> None:
    _CTRL_C.append(signum)
    raise KeyboardInterrupt


# Flags that must keep Hydra's own behaviour (its help about Hydra itself, shell completion...).
_HYDRA_FLAGS = ("--hydra-help", "--cfg", "-c", "--info", "--shell-completion", "-sc", "--run",
                "-m", "--multirun")  # fmt: skip


def wants_app_help(argv: list[str]) -> bool:
    return "--help" in argv or ("-h" in argv and not any(a in _HYDRA_FLAGS for a in argv))


def entry(config_name: str, task: Callable[[Any], Any]) -> None:
    """Run `task(cfg)` on conf/<config_name>.yaml composed with the command line."""
    argv = sys.argv[1:]
    load_env_file()  # before anything reads the environment (FASTTRAIN_ROOT, the trackers)
    run_task(check_root)
    if wants_app_help(argv):
        from fasttrain.cli.help import print_app_help  # only then

        print_app_help(config_name, argv)
        return
    from fasttrain.config.overrides import check_command_line

    if os.environ.get("LOCAL_RANK", "0") != "0":  # a DDP rank; of a sweep job: that job only
        from fasttrain.distributed.multirun import rank_argv

        argv = rank_argv(argv)
    checked = run_task(check_command_line, config_name, argv)  # bad input: one line, no files
    if checked.run is None:  # a sweep, --cfg, or a flag only Hydra answers: Hydra runs it
        if not checked.prints_only:  # --cfg prints the config: no data module is built or read
            run_task(construct_each, checked.jobs)
        gc.enable()  # (see `script`) a sweep's jobs come and go: each is collected as usual
        run_by_hydra(config_name, task, argv)
        return
    job = checked.jobs[0]
    with held_log_lines() as held:  # Lightning's lines go to the run's log, or nowhere
        built = run_task(build_checked, job)
    claim = None
    if first_process():  # the other ranks of a DDP job share its claim
        claim = run_task(claim_run_dir, job, checked.run_dir, built)
    try:
        if _AS_PROCESS:  # what start-up made lives as long as the run (see `script`)
            gc.freeze()
            gc.enable()
        run_checked(checked, config_name, task, claim, held, built)
    finally:
        if claim is not None:
            claim.release()


def run_checked(checked: Any, config_name: str, task: Callable[[Any], Any],
                claim: RunClaim | None, held: HeldLines, built: Any) -> None:  # fmt: skip
    """The single run `checked` describes, as @hydra.main runs it (its folder, .hydra/, the
    log set up, the exit code and traceback of a crash), on the config the check composed: Hydra
    does not compose the command line again. `built` (the run the check built from that config,
    or None) is handed to the task: the run is built once."""
    # Private: Hydra runs a job this way in Hydra.run, which composes first; hydra.main has no
    # entry for a config composed already. tests/test_train_cli.py fails loudly if they move.
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.utils import run_and_report
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import configure_log, run_job
    from hydra.types import HydraContext

    cfg = checked.run
    GlobalHydra.instance().clear()
    GlobalHydra.instance().initialize(checked.hydra)

    def task_function(job: Any) -> float | None:
        one_log_stream()
        held.replay()
        return in_hydra(job, task, claim, built)

    def run() -> None:
        configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=config_name)
        context = HydraContext(config_loader=checked.hydra.config_loader, callbacks=callbacks)
        ret = run_job(hydra_context=context, task_function=task_function, config=cfg,
                      job_dir_key="hydra.run.dir", job_subdir_key=None)  # fmt: skip
        callbacks.on_run_end(config=cfg, config_name=config_name, job_return=ret)
        ret.return_value  # noqa: B018  (raises what the task raised, as Hydra.run does)

    try:
        run_and_report(run)
    finally:
        GlobalHydra.instance().clear()


def run_by_hydra(config_name: str, task: Callable[[Any], Any], argv: list[str]) -> None:
    """A sweep, or a command Hydra answers itself (--cfg, --info, ...): @hydra.main on `argv`."""
    import hydra

    sys.argv[1:] = argv

    @hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=config_name)
    def hydra_main(cfg: Any) -> float | None:
        one_log_stream()
        return in_hydra(cfg, task, None)

    hydra_main()


def in_hydra(cfg: Any, task: Callable[..., Any], claim: RunClaim | None,
             built: Any = None) -> float | None:  # fmt: skip
    """The task inside Hydra's job: the run's name read once, the task run, the value a sweeper
    optimises returned (the finished run's files are kept). A task with a `built` parameter
    (tasks.train) is handed the run the check built, where it built one."""
    from fasttrain.config.overrides import pin_run_name

    pin_run_name(cfg)
    if claim is not None and claim.moved is not None:
        log.info("resume=never: the previous run in %s is kept in %s", *map(shown, claim.moved))
    if built is not None and takes_built(task):
        task = functools.partial(task, built=built)  # else the task builds its own run
    result = run_task(task, cfg, undo=claim.undo if claim else None)
    return run_task(optimized_metric, result, cfg.get("optimized_metric"))


def takes_built(task: Callable[..., Any]) -> bool:
    """Whether `task` takes the run the check built (a `built` parameter, as tasks.train)."""
    try:
        return "built" in inspect.signature(task).parameters
    except (TypeError, ValueError):  # a callable without a signature Python can read
        return False


# Set by `script`: this process is the entry point's own (not a test or a notebook calling main).
_AS_PROCESS = False


# conf/paths/default.yaml: runs, data and logs go under this folder when it is set.
ROOT_ENV = "FASTTRAIN_ROOT"


def check_root() -> None:
    """FASTTRAIN_ROOT set but empty would make the root the filesystem's (`/logs`, `/data`): it
    is read as unset, said once (removed from the environment, so DDP ranks and sweep jobs
    started from here do not say it again). A relative root would move with the folder a
    command starts from: refused."""
    root = os.environ.get(ROOT_ENV)
    if root is None:
        return
    if not root.strip():
        del os.environ[ROOT_ENV]
        print(f"note: {ROOT_ENV} is set but empty: read as unset (runs go under logs/ of "
              "the folder you start from)", file=sys.stderr)  # fmt: skip
        return
    if not os.path.isabs(root):
        raise UserError(f"{ROOT_ENV}={root}: expected an absolute path (e.g. "
                        f"{ROOT_ENV}=$PWD/{root}), or unset it")  # fmt: skip
    if os.path.exists(root) and not os.path.isdir(root):  # logs/ and data/ go below it
        raise UserError(f"{ROOT_ENV}={root}: is a file; expected a folder (made if missing), "
                        "or unset it")  # fmt: skip


def script(main: Callable[[], Any], config_name: str = "") -> None:
    """`main` as the process itself (`python train.py`, `python -m fasttrain.evaluate`, the
    console scripts): a refusal (exit 2) ends the process at once. A normal exit first joins
    every non-daemon thread and runs every atexit handler, and one that a library or a user's
    sitecustomize left waiting (an uploader, a pool) keeps a refused run alive for minutes.
    Everything a refusal must do (one line, its undo, the lock released) is done by then.
    In-process callers (tests, notebooks) call `main` and get SystemExit as usual. Ctrl-C
    (outside fit, which saves first: fasttrain.fit) is one `stopped by Ctrl-C` line saying what
    was left, and exit code 130, at once; in-process callers get KeyboardInterrupt.

    As the process itself, start-up runs without the cyclic garbage collector: importing
    torch, Lightning and the run's modules makes ~500k objects that live as long as the
    process, and each full collection walks them all again (~1.5 s of collections during a
    `python train.py` start-up on a 2-core machine, ~0.4 s more at the first validation step).
    A single run then freezes what start-up made (gc.freeze: never collected, never walked
    again; the cycles start-up left behind, ~10 MB, stay too) and turns collection back on;
    a sweep, whose jobs come and go, only turns it back on. Never in-process: a later run's
    objects would never be freed."""
    global _AS_PROCESS
    _AS_PROCESS = True
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not ignored (nohup)
        signal.signal(signal.SIGINT, _note_ctrl_c)
    gc.disable()
    try:
        main()
    except KeyboardInterrupt:
        left = INTERRUPTED.get(config_name)
        print("stopped by Ctrl-C" + (f": {left}" if left else ""), file=sys.stderr)
        _exit_now(CTRL_C_EXIT)
    except SystemExit as err:
        if err.code not in (USER_ERROR_EXIT, DIVERGED_EXIT):
            raise
        _exit_now(DIVERGED_EXIT if err.code == DIVERGED_EXIT else USER_ERROR_EXIT)
    finally:
        _AS_PROCESS = False
        gc.enable()


def _exit_now(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        logging.shutdown()
    os._exit(code)


def entry_points(config_name: str, task: Callable[[Any], Any]) -> tuple[Callable[[], None], ...]:
    """(main, run) of an entry point module: `main` for in-process callers (tests, notebooks),
    `run` for the process itself (`python -m ...`, the console scripts; see `script`). `task`
    takes the composed config; a training task that also takes `built` (as tasks.train does)
    gets the (trainer, model, datamodule) the command-line check built, instead of building
    them a second time."""
    main = functools.partial(entry, config_name, task)
    return main, functools.partial(script, main, config_name)


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


def run_task(task: Callable[..., T], *args: Any, undo: Callable[[], None] | None = None) -> T:
    """Run an entry point's task; turn a UserError into one line on stderr and exit code 2, a
    DivergedError into one `diverged:` line and exit code 3 (the run's folder is kept).

    `undo` takes back what this invocation wrote into its run folder (RunClaim.undo).
    """
    try:
        return task(*args)
    except UserError as err:
        if undo is not None:
            undo()
        if show_tracebacks():
            raise
        print(f"error: {one_line(err)}", file=sys.stderr)
        sys.exit(USER_ERROR_EXIT)
    except DivergedError as err:
        if show_tracebacks():
            raise
        print(f"diverged: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(DIVERGED_EXIT)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT) or show_tracebacks():
            raise
        from fasttrain.checkpoints.resume import disk_full

        print(f"error: {disk_full(err)}", file=sys.stderr)
        sys.exit(1)
    except Exception:
        if _CTRL_C and not show_tracebacks():  # a library that made the Ctrl-C its own error
            raise KeyboardInterrupt from None  # (onnxruntime's import: "initialization failed")
        raise


def one_line(err: UserError) -> str:
    """The error's message; for one raised in a DataLoader worker process (an image that fails
    to decode), torch re-raises it as "Caught UserError in DataLoader worker process 0.
    Original Traceback ...": the original message is its last line, after the type's name."""
    text = str(err)
    if text.startswith("Caught ") and "Original Traceback" in text:
        last = text.rstrip().splitlines()[-1]
        return last.split(f"{type(err).__name__}: ", 1)[-1]
    return text


def first_process() -> bool:
    """False in a rank > 0 of a distributed job: started by torchrun (RANK), SLURM
    (SLURM_PROCID), or Lightning's own launcher for trainer=ddp/ddp_cpu (LOCAL_RANK, NODE_RANK)."""
    ranks = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID")
    return all(os.environ.get(name, "0") == "0" for name in ranks)
