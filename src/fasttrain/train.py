"""Training entry: compose -> validate -> instantiate -> fit -> test. Nothing else.

python train.py trainer.precision=16-mixed data.batch_size=128
"""

from __future__ import annotations

import sys
from typing import Any, cast

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from fasttrain import CONFIG_DIR
from fasttrain.errors import run_task
from fasttrain.help import print_app_help, wants_app_help
from fasttrain.launch import rank_argv
from fasttrain.precheck import precheck
from fasttrain.sweep import optimized_metric


def train(cfg: DictConfig) -> dict[str, float]:
    # Deferred: torch and Lightning load only when a run starts, so `--help` stays fast.
    import lightning as L

    from fasttrain import launch, oom, resume, tuning
    from fasttrain.build import build, build_all, report, validate
    from fasttrain.callbacks.hparams import log_hparams

    validate(cfg)
    tuner = cast(dict[str, Any], OmegaConf.to_container(cfg.get("tuner") or OmegaConf.create()))
    tuning.check_tuner(**tuner)
    tuning.set_matmul_precision(cfg.get("matmul_precision"))
    ckpt_path = resume.checkpoint_to_resume(cfg.get("resume"), cfg.paths.output_dir)
    L.seed_everything(cfg.seed, workers=True)
    datamodule = build(cfg.data, "data")
    model = build(cfg.model, "model")
    callbacks = [*build_all(cfg.get("callbacks"), "callbacks"), resume.ResumeState(cfg.seed)]
    loggers = build_all(cfg.get("logger"), "logger")
    trainer = build(cfg.trainer, "trainer", callbacks=callbacks, logger=loggers or False,
                    plugins=[resume.AtomicCheckpointIO()])  # fmt: skip

    if cfg.get("train", True):
        launch.share_job_with_ranks()  # DDP ranks of a sweep job run this job, not the sweep
        tuning.tune(trainer, model, datamodule, **tuner)
        oom.fit(trainer, model, datamodule, ckpt_path, cfg.get("oom_fallback", False), resume.fit)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}

    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    if cfg.get("test", True):
        # Test the best checkpoint, not the last weights; without one, the weights as they are.
        results = trainer.test(
            model, datamodule=datamodule, ckpt_path=best or None, weights_only=True
        )
        metrics.update(results[0] if results else {})
    report(cfg.paths.output_dir, metrics, best or None)
    log_hparams(loggers, OmegaConf.to_container(cfg, resolve=True), metrics)
    return metrics


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def _hydra_main(cfg: DictConfig) -> float | None:
    metrics = run_task(
        train, cfg, run_dirs=(HydraConfig.get().runtime.output_dir, cfg.paths.log_dir)
    )
    # What a sweeper (hparams_search=optuna) optimises; the finished run's files are kept.
    return run_task(optimized_metric, metrics, cfg.get("optimized_metric"))


def main() -> None:
    if wants_app_help(sys.argv[1:]):
        print_app_help("train", sys.argv[1:])
    else:
        sys.argv[1:] = rank_argv(sys.argv[1:])  # a DDP rank of a sweep job: that job only
        run_task(precheck, "train", sys.argv[1:])  # bad overrides: one line, nothing written
        _hydra_main()


if __name__ == "__main__":
    main()
