"""Every entry point goes through `entry(config_name, task)`: a fast `--help`, the command line
checked before Hydra writes anything, the run folder claimed, the task run inside Hydra, and the
exit codes: 0 done, 1 a crash (traceback), 2 bad input (one `error:` line, nothing written or
lost), 143/130 stopped by SIGTERM/Ctrl-C (fasttrain.fit).

Before Hydra starts: every job's config is composed and checked (config/overrides.py) and
what it configures is built and thrown away (`construct_each`), so a bad value anywhere in a
sweep is refused before the sweep folder exists. A single run then claims its folder
(`RunClaim`): a lock a second run with the same run_name respects, the checks that could refuse
to resume it, and, with resume=never, the old run moved aside; Hydra is pinned to that folder.

    python train.py ...                 entry("train", tasks.train)
    python -m fasttrain.evaluate ...    entry("eval", tasks.evaluate)   (export, predict alike)

The `--help` here lists the groups from conf/ and composes once: Hydra's own help copies its
config repository once per group it lists (~0.6 s more on a 2-core machine).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from fasttrain import CONFIG_DIR, shown
from fasttrain.config.errors import UserError

T = TypeVar("T")
log = logging.getLogger(__name__)

# Exit code for bad input, distinct from 1 (a crash) so scripts can tell them apart.
USER_ERROR_EXIT = 2


def entry(config_name: str, task: Callable[[Any], Any]) -> None:
    """Run `task(cfg)` on conf/<config_name>.yaml composed with the command line."""
    argv = sys.argv[1:]
    run_task(check_root)
    if wants_app_help(argv):
        print_app_help(config_name, argv)
        return
    from fasttrain.config.overrides import check_command_line
    from fasttrain.distributed.multirun import rank_argv

    argv = rank_argv(argv)  # a DDP rank of a sweep job: that job only
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
    does not compose the command line again. `built` (the check's run) is what the task's
    build_run returns."""
    # Private: Hydra runs a job this way in Hydra.run, which composes first; hydra.main has no
    # entry for a config composed already. tests/test_train_cli.py fails loudly if they move.
    from hydra._internal.callbacks import Callbacks
    from hydra._internal.utils import run_and_report
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import configure_log, run_job
    from hydra.types import HydraContext

    from fasttrain.assemble import handing_over

    cfg = checked.run
    GlobalHydra.instance().clear()
    GlobalHydra.instance().initialize(checked.hydra)

    def task_function(job: Any) -> float | None:
        one_log_stream()
        held.replay()
        return in_hydra(job, task, claim)

    def run() -> None:
        configure_log(cfg.hydra.hydra_logging, cfg.hydra.verbose)
        callbacks = Callbacks(cfg)
        callbacks.on_run_start(config=cfg, config_name=config_name)
        context = HydraContext(config_loader=checked.hydra.config_loader, callbacks=callbacks)
        with handing_over(built, checked.jobs[0]):
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


def in_hydra(cfg: Any, task: Callable[[Any], Any], claim: RunClaim | None) -> float | None:
    """The task inside Hydra's job: the run's name read once, the task run, the value a sweeper
    optimises returned (the finished run's files are kept)."""
    from fasttrain.config.overrides import pin_run_name

    pin_run_name(cfg)
    if claim is not None and claim.moved is not None:
        log.info("resume=never: the previous run in %s is kept in %s", *map(shown, claim.moved))
    result = run_task(task, cfg, undo=claim.undo if claim else None)
    return run_task(optimized_metric, result, cfg.get("optimized_metric"))


def build_checked(job: Any) -> Any:
    """The training run of a checked job (trainer, model, data module), built before Hydra
    writes anything: a bad value a constructor refuses (data.batch_size=0, ...) is one line and
    no folder, and the run goes on with these objects. None for an entry point that takes its
    model from a checkpoint (evaluate, export, predict), or a config without a run's keys."""
    if "model" not in job or "ckpt_path" in job:  # +model=... there: restore refuses it
        return None
    from fasttrain import assemble
    from fasttrain.checkpoints.allow import check_loadable

    check_loadable(job)  # what its checkpoints name must load again
    if not all(key in job for key in ("seed", "data", "trainer")):  # not a run build_run knows
        construct(job)
        return None
    return assemble.build_run(job, validated=True)  # the check validated it


class HeldLines(logging.Handler):
    """Log lines and warnings from building the run before Hydra sets up logging (the run's
    log file does not exist yet): kept, then given to the handlers Hydra sets up (`replay`), or
    dropped when the command line is refused (its one line is all it prints)."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []
        self.warnings: list[Any] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def replay(self) -> None:
        import warnings

        records, self.records = self.records, []
        for record in records:
            logger = logging.getLogger(record.name)
            if logger.isEnabledFor(record.levelno):  # as if logged now, with the run's levels
                logger.handle(record)
        caught, self.warnings = self.warnings, []
        for w in caught:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno, w.file, w.line)


@contextlib.contextmanager
def held_log_lines() -> Iterator[HeldLines]:
    import warnings

    held = HeldLines()
    one_log_stream()  # Lightning's loggers propagate to the root logger, which holds them here
    root = logging.getLogger()
    level, before = root.level, list(root.handlers)
    # The held lines alone: the root's handlers of an earlier run in this process (a console
    # bound to a stream since closed, ...) would get every line at DEBUG.
    root.handlers = [held]
    root.setLevel(logging.DEBUG)  # replay applies the levels the run sets up
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            yield held
        held.warnings = caught
    finally:
        root.handlers = [h for h in root.handlers if h is not held] + before
        root.setLevel(level)


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


def script(main: Callable[[], Any]) -> None:
    """`main` as the process itself (`python train.py`, `python -m fasttrain.evaluate`, the
    console scripts): a refusal (exit 2) ends the process at once. A normal exit first joins
    every non-daemon thread and runs every atexit handler, and one that a library or a user's
    sitecustomize left waiting (an uploader, a pool) keeps a refused run alive for minutes.
    Everything a refusal must do (one line, its undo, the lock released) is done by then.
    In-process callers (tests, notebooks) call `main` and get SystemExit as usual.

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
    gc.disable()
    try:
        main()
    except SystemExit as err:
        if err.code != USER_ERROR_EXIT:
            raise
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        logging.shutdown()
        os._exit(USER_ERROR_EXIT)
    finally:
        _AS_PROCESS = False
        gc.enable()


def entry_points(config_name: str, task: Callable[[Any], Any]) -> tuple[Callable[[], None], ...]:
    """(main, run) of an entry point module: `main` for in-process callers (tests, notebooks),
    `run` for the process itself (`python -m ...`, the console scripts; see `script`)."""
    main = functools.partial(entry, config_name, task)
    return main, functools.partial(script, main)


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
    """Run an entry point's task; turn a UserError into one line on stderr and exit code 2.

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


def one_log_stream() -> None:
    """Send Lightning's log lines through the handlers Hydra configured (console and the run's
    <task>.log, conf/hydra/default.yaml), once each. Lightning gives its loggers a console
    handler of their own and stops them propagating when it is imported before logging is
    configured, which the command-line check does: its lines then missed the log file."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "pytorch_lightning",
                 "lightning_fabric"):  # fmt: skip
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler:  # Lightning's own; a user's file stays
                logger.removeHandler(handler)
        logger.propagate = True


# In each run folder: held (flock) by the run writing there, so a second one refuses to start.
LOCK_FILE = ".run.lock"


class RunClaim:
    """This invocation's hold on its run folder, taken before Hydra writes into it.

    A lock other runs respect (flock: the kernel drops it when the process ends, however it
    ends, so a killed run never leaves the folder locked), and a record of what the folder held,
    so that a run failing on bad input takes back exactly what it wrote and nothing else:
    new files and folders are removed, the config files Hydra rewrote get their old bytes back,
    a log that existed is cut back to its old length.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._record()
        self.fd: int | None = None
        self.moved: tuple[Path, Path] | None = None  # (run folder, where its old run went)

    def _record(self) -> None:
        out = self.run_dir
        self.existed = next(p for p in (out, *out.parents) if p.exists())
        self.before = {p.relative_to(out) for p in out.rglob("*")} if out.is_dir() else set()
        rewritten = [*out.glob(".hydra/*"), out / LOCK_FILE]  # Hydra's config; the lock's pid
        self.saved = {p: p.read_bytes() for p in rewritten if p.is_file()}
        self.log_sizes = {p: p.stat().st_size for p in out.glob("*.log") if p.is_file()}

    def lock(self, run_name: str) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.fd = _lock(self.run_dir, run_name)

    def move_aside(self, run_name: str) -> None:
        """resume=never where a run already is: keep that run, renamed, and start empty."""
        if not any(p.name != LOCK_FILE for p in self.run_dir.iterdir()):
            return
        stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
        aside = self.run_dir.with_name(f"{self.run_dir.name}.replaced-{stamp}")
        for n in range(1, 1000):
            if not aside.exists():
                break
            aside = aside.with_name(f"{self.run_dir.name}.replaced-{stamp}-{n}")
        old_lock = self.fd
        os.rename(self.run_dir, aside)  # its lock file goes along, still held until the new one
        self.moved = (self.run_dir, aside)
        self._record()
        self.lock(run_name)
        if old_lock is not None:
            os.close(old_lock)

    def undo(self) -> None:
        out = self.run_dir
        _close_logs_in(out)
        for path in sorted(out.rglob("*"), reverse=True) if out.is_dir() else []:
            if path.relative_to(out) in self.before:
                continue
            if path.is_dir() and not path.is_symlink():
                with contextlib.suppress(OSError):
                    path.rmdir()  # only when empty: a new folder with old files stays
            else:
                path.unlink(missing_ok=True)
        for path, data in self.saved.items():
            path.write_bytes(data)
        for path, size in self.log_sizes.items():
            with contextlib.suppress(OSError):
                os.truncate(path, size)
        for folder in (out, *out.parents):
            if folder == self.existed or not folder.is_relative_to(self.existed):
                break
            with contextlib.suppress(OSError):
                folder.rmdir()
        if self.moved is not None and not self.moved[0].exists():
            os.rename(self.moved[1], self.moved[0])
            self.moved = None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def _close_logs_in(folder: Path) -> None:
    """Detach and close the log handlers writing into `folder` before its files go (Hydra put
    the run's log on the root logger): a later run in this process (a notebook, a test) would
    otherwise log into a deleted file and fail."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in (lg for lg in loggers if isinstance(lg, logging.Logger)):
        for handler in list(logger.handlers):
            if isinstance(handler, logging.FileHandler) and Path(
                handler.baseFilename
            ).is_relative_to(folder):
                logger.removeHandler(handler)
                handler.close()


def _lock(run_dir: Path, run_name: str) -> int | None:
    try:
        import fcntl
    except ImportError:  # Windows: no flock; runs there are not protected from each other
        return None
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        owner = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise UserError(
            f"run_name={run_name}: another run (pid {owner}) is writing to {shown(run_dir)}; "
            "wait for it to end, or choose another run_name"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def claim_run_dir(job: Any, run_dir: Path, built: Any = None) -> RunClaim:
    """Lock the run folder, then make every check that could refuse to resume (readable
    checkpoint, same model, not past trainer.max_epochs) or, with resume=never, move the old run
    aside: all before Hydra writes its config into the folder. `built`: the run's (trainer,
    model, data module), which the checkpoint is checked against."""
    claim = RunClaim(run_dir)
    claim.lock(str(job.get("run_name")))  # refused: the folder is another run's, nothing to undo
    try:
        if job.get("resume") == "never":
            claim.move_aside(str(job.get("run_name")))
        elif job.get("resume") is not None:
            check_resume(job, run_dir, built)
    except BaseException:
        claim.undo()
        claim.release()
        raise
    return claim


def check_resume(job: Any, run_dir: Path, built: Any = None) -> None:
    """Read and check the checkpoint the run would continue from, once: fit finds the result
    (fasttrain.checkpoints.resume.check_fits) for the same model, data module and file."""
    from fasttrain.checkpoints.resume import check_fits, checkpoint_to_resume

    ckpt = checkpoint_to_resume(job.resume, run_dir)
    if ckpt is not None:
        max_epochs = job.trainer.get("max_epochs")
        _, model, datamodule = built if built is not None else (None, *construct(job))
        check_fits(ckpt, model, max_epochs, resume=str(job.resume), data=datamodule)


def construct_each(jobs: list[Any]) -> None:
    """Build what each training job configures and throw it away, before Hydra writes anything:
    the range checks live in the constructors (data.batch_size=0, trainer.accumulate_grad_batches
    =0, ...), so this is what refuses a bad value in any job of a sweep."""
    from fasttrain.checkpoints.allow import check_loadable

    for job in jobs:
        if "model" in job:  # evaluate, export, predict take their model from a checkpoint
            construct(job)
            check_loadable(job)  # what its checkpoints name must load again


def construct(job: Any) -> tuple[Any, Any]:
    """The data module, callbacks and trainer of a training job, and its model on the meta
    device (parameter shapes only: no memory, no init cost), built quietly (Lightning's
    start-up lines belong to the run). Returns (the model, or None when it cannot be built on
    the meta device (fit then checks it against a checkpoint); the data module)."""
    import warnings

    import torch

    from fasttrain.assemble import build, build_all, build_model

    logging.disable(logging.INFO)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            datamodule = build(job.data, "data")
            callbacks = build_all(job.get("callbacks"), "callbacks")
            build(job.trainer, "trainer", callbacks=callbacks, logger=False)
            try:
                with torch.device("meta"):
                    return build_model(job.model), datamodule
            except UserError:
                raise
            except Exception:
                return None, datamodule
    finally:
        logging.disable(logging.NOTSET)


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
        # hydra/ is Hydra's own; _shared/ holds pieces other configs merge in, not options
        if group != "." and group != "hydra" and not group.startswith("_"):
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
