"""Evaluation entry: rebuild a Classifier from a checkpoint and reproduce its test metrics.

python -m fasttrain.evaluate ckpt_path=logs/train/<run>/checkpoints/last.ckpt
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict

from fasttrain import CONFIG_DIR
from fasttrain.errors import UserError, run_task
from fasttrain.help import print_app_help, wants_app_help
from fasttrain.precheck import precheck


def evaluate(cfg: DictConfig) -> dict[str, float]:
    if OmegaConf.is_missing(cfg, "ckpt_path") or not cfg.ckpt_path:
        raise UserError("ckpt_path is required: python -m fasttrain.evaluate ckpt_path=PATH.ckpt")
    import lightning as L

    from fasttrain.build import build, report, validate
    from fasttrain.checkpoint import load_classifier
    from fasttrain.data.base import LOADER_ARGS

    model, data_hparams = load_classifier(cfg.ckpt_path)
    # The split comes from the checkpoint (seed, fractions, ...) so the test set is the one the
    # run was tested on; loader knobs stay this machine's.
    with open_dict(cfg.data):
        for key, value in data_hparams.items():
            if key in cfg.data and key not in LOADER_ARGS:
                cfg.data[key] = value
    validate(cfg)
    L.seed_everything(cfg.seed, workers=True)
    datamodule = build(cfg.data, "data")
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
