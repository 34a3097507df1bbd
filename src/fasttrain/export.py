"""Export entry: a checkpoint -> ONNX, TorchScript, int8 and fp16 files, each read back and checked.

python -m fasttrain.export ckpt_path=logs/train/<run>/checkpoints/last.ckpt format=all
Writes <run>/export/{model.onnx, model.ts, model_int8.pt, model_fp16.pt, export_report.json}.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from fasttrain import CONFIG_DIR
from fasttrain.errors import UserError, require_ckpt, run_task
from fasttrain.help import print_app_help, wants_app_help


def export(cfg: DictConfig) -> dict[str, Any]:
    require_ckpt(cfg, "export")
    import torch

    from fasttrain.build import build, restore
    from fasttrain.deploy import export_and_verify, resolve_device, run_dir_of, select

    # Every argument is checked before the checkpoint is read, and that before a file is written.
    exporters = select(str(cfg.format))
    device = resolve_device(str(cfg.device))
    if not cfg.latency_time > 0:
        raise UserError(f"latency_time={cfg.latency_time}: expected seconds > 0")
    tolerance = build(cfg.tolerance, "tolerance")
    model, datamodule = restore(cfg)
    x = next(iter(datamodule.test_dataloader()))[0]
    example = x[torch.arange(max(2, len(x))) % len(x)]  # torch.export needs a batch of >= 2
    out_dir = Path(cfg.output_dir) if cfg.output_dir else run_dir_of(cfg.ckpt_path) / "export"
    return export_and_verify(
        model.net, exporters, example, datamodule.test_dataloader(), out_dir, device,
        tolerance, float(cfg.latency_time), source=str(cfg.ckpt_path),
    )  # fmt: skip


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="export")
def _hydra_main(cfg: DictConfig) -> None:
    report = run_task(
        export, cfg, run_dirs=(HydraConfig.get().runtime.output_dir, cfg.paths.log_dir)
    )
    from fasttrain.deploy import failures

    missed = failures(report)
    if missed and cfg.strict:
        print("error: export check failed:\n  " + "\n  ".join(missed), file=sys.stderr)
        sys.exit(1)


def main() -> None:
    if wants_app_help(sys.argv[1:]):
        print_app_help("export", sys.argv[1:])
    else:
        _hydra_main()


if __name__ == "__main__":
    main()
