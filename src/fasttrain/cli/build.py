"""What a checked job configures, built before Hydra writes anything: the run itself
(`build_checked`), or each job's objects built and thrown away (`construct_each`), so that a bad
value a constructor refuses is one line and no folder."""

from __future__ import annotations

import logging
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
