"""Training entry: compose -> validate -> instantiate -> fit -> test. Nothing else.

python train.py trainer.precision=16-mixed data.batch_size=128
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from fasttrain import CONFIG_DIR
from fasttrain.errors import run_task
from fasttrain.help import print_app_help, wants_app_help


def train(cfg: DictConfig) -> dict[str, float]:
    # Deferred: torch and Lightning load only when a run starts, so `--help` stays fast.
    import lightning as L

    from fasttrain.build import build, build_all, report, validate

    validate(cfg)
    L.seed_everything(cfg.seed, workers=True)
    datamodule = build(cfg.data, "data")
    model = build(cfg.model, "model")
    callbacks = build_all(cfg.get("callbacks"), "callbacks")
    loggers = build_all(cfg.get("logger"), "logger")
    trainer = build(cfg.trainer, "trainer", callbacks=callbacks, logger=loggers or False)

    if cfg.get("train", True):
        # weights_only: resuming never unpickles code from a checkpoint file.
        trainer.fit(model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"), weights_only=True)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}

    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    if cfg.get("test", True):
        # Test the best checkpoint, not the last weights; without one, the weights as they are.
        results = trainer.test(
            model, datamodule=datamodule, ckpt_path=best or None, weights_only=True
        )
        metrics.update(results[0] if results else {})
    report(cfg.paths.output_dir, metrics, best or None)
    return metrics


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def _hydra_main(cfg: DictConfig) -> None:
    run_task(train, cfg, run_dirs=(HydraConfig.get().runtime.output_dir, cfg.paths.log_dir))


def main() -> None:
    if wants_app_help(sys.argv[1:]):
        print_app_help("train", sys.argv[1:])
    else:
        _hydra_main()


if __name__ == "__main__":
    main()
