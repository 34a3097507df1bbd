"""Helpers for the GPU-practice tests: compose the train config with overrides and build the
pieces in-process with the train task's own `build_run`, small and quiet, so each practice's
effect can be inspected directly."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from conftest import CONF

# A linear-ish MLP on digits, no workers, no checkpoint or logger unless a test asks for them.
QUICK = [
    "model=mlp", "model.scheduler=null", "data.num_workers=0", "callbacks=none", "logger=none",
    "trainer.max_epochs=1", "trainer.limit_train_batches=4", "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1", "+trainer.enable_progress_bar=false",
    "+trainer.enable_model_summary=false", "+trainer.enable_checkpointing=false",
]  # fmt: skip


def compose_train(tmp_path: Path, *overrides: str, quick: bool = True) -> DictConfig:
    args = [*(QUICK if quick else []), f"paths.root_dir={tmp_path}",
            f"paths.output_dir={tmp_path}/run", *overrides]  # fmt: skip
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("train", overrides=args)


def build_run(cfg: DictConfig, callbacks: list[Any] = (), **model_kwargs: Any):
    """(trainer, model, datamodule) from `cfg`, exactly as the train task builds them."""
    from fasttrain.assemble import build_run as assemble

    return assemble(cfg, callbacks, **model_kwargs)


def seen_in_training(look: Callable[[Any, Any], Any]) -> Any:
    """A callback keeping `look(trainer, module)` from the last training batch in `.seen`: what
    the run looked like while it trained (fit's end moves the module back to the CPU)."""
    import lightning as L

    class SeenInTraining(L.Callback):
        seen: Any = None

        def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
            self.seen = look(trainer, module)

    return SeenInTraining()
