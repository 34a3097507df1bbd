"""Predict entry: a checkpoint's classes and probabilities for the test split or an .npy file.

python -m fasttrain.predict ckpt_path=logs/train/<run>/checkpoints/last.ckpt [input=x.npy]
Writes predictions.csv (index, pred, prob; label on the test split) to the run's folder.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from fasttrain import CONFIG_DIR
from fasttrain.errors import require_ckpt, run_task
from fasttrain.help import print_app_help, wants_app_help


def predict(cfg: DictConfig) -> Path:
    require_ckpt(cfg, "predict")
    from rich.console import Console

    from fasttrain.build import restore
    from fasttrain.deploy import resolve_device, torch_runner
    from fasttrain.deploy.predict import load_inputs, predict, write_predictions

    device = resolve_device(str(cfg.device))
    model, datamodule = restore(cfg)
    if cfg.input:
        x = load_inputs(cfg.input, datamodule.input_shape)
        batches = ((xb, None) for xb in x.split(int(cfg.data.batch_size)))
    else:
        batches = datamodule.test_dataloader()
    out = Path(cfg.output_dir or cfg.paths.output_dir) / "predictions.csv"
    summary = write_predictions(out, predict(torch_runner(model.net, device), batches))
    shown = ", ".join(
        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in summary.items()
    )
    Console(soft_wrap=True).print(f"[bold]predictions[/] {out} ({shown})")
    return out


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="predict")
def _hydra_main(cfg: DictConfig) -> None:
    run_task(predict, cfg, run_dirs=(HydraConfig.get().runtime.output_dir, cfg.paths.log_dir))


def main() -> None:
    if wants_app_help(sys.argv[1:]):
        print_app_help("predict", sys.argv[1:])
    else:
        _hydra_main()


if __name__ == "__main__":
    main()
