"""Evaluation entry: rebuild a Classifier from a checkpoint and reproduce its test metrics.

python -m fasttrain.evaluate ckpt_path=logs/train/<run>/checkpoints/last.ckpt
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from fasttrain import CONFIG_DIR
from fasttrain.errors import require_ckpt, run_task
from fasttrain.help import print_app_help, wants_app_help
from fasttrain.precheck import precheck


def evaluate(cfg: DictConfig) -> dict[str, float]:
    require_ckpt(cfg, "evaluate")
    import lightning as L

    from fasttrain.build import build, report, restore

    L.seed_everything(cfg.seed, workers=True)
    model, datamodule = restore(cfg)
    trainer = build(cfg.trainer, "trainer", logger=False)
    results = trainer.test(model, datamodule=datamodule)
    metrics = dict(results[0]) if results else {}
    report(cfg.paths.output_dir, metrics, str(cfg.ckpt_path))
    return metrics


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="eval")
def _hydra_main(cfg: DictConfig) -> None:
    run_task(evaluate, cfg, run_dirs=(HydraConfig.get().runtime.output_dir, cfg.paths.log_dir))


def main() -> None:
    if wants_app_help(sys.argv[1:]):
        print_app_help("eval", sys.argv[1:])
    else:
        run_task(precheck, "eval", sys.argv[1:])  # bad overrides: one line, nothing written
        _hydra_main()


if __name__ == "__main__":
    main()
