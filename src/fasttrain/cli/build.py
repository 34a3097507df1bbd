"""What a checked job configures, built before Hydra writes anything: the run itself
(`build_checked`), or each job's objects built and thrown away (`construct_each`), so that a bad
value a constructor refuses is one line and no folder. The log lines of that build are held
(`held_log_lines`) until Hydra has set up the run's log."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from fasttrain.config.errors import UserError


def build_checked(job: Any) -> Any:
    """The training run of a checked job (trainer, model, data module), built before Hydra
    writes anything: a bad value a constructor refuses (data.batch_size=0, ...) is one line and
    no folder, and the run goes on with these objects. None for an entry point that takes its
    model from a checkpoint (evaluate, export, predict), or a config without a run's keys."""
    if "model" not in job or "ckpt_path" in job:  # +model=... there: restore refuses it
        return None
    from fasttrain import assemble
    from fasttrain.checkpoints.allow import check_loadable

    a_run = all(key in job for key in ("seed", "data", "trainer"))  # one build_run knows
    check_loadable(job)  # what its checkpoints name must load again
    if not a_run:
        construct(job)
        return None
    return assemble.build_run(job, validated=True)  # the check validated it


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
