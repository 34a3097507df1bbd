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
from omegaconf import DictConfig, OmegaConf, open_dict

from fasttrain import CONFIG_DIR
from fasttrain.errors import UserError, run_task
from fasttrain.help import print_app_help, wants_app_help


def require_ckpt(cfg: DictConfig) -> None:
    if OmegaConf.is_missing(cfg, "ckpt_path") or not cfg.ckpt_path:
        raise UserError(
            f"ckpt_path is required: python -m fasttrain.{cfg.task_name} ckpt_path=PATH"
        )


def restore(cfg: DictConfig) -> tuple[Any, Any]:
    """(Classifier in eval mode, set-up data module) for `cfg.ckpt_path`, as evaluate rebuilds
    them: the data split comes from the checkpoint, loader knobs stay this machine's."""
    require_ckpt(cfg)
    from fasttrain.build import build, validate
    from fasttrain.checkpoint import load_classifier
    from fasttrain.data.base import LOADER_ARGS

    model, data_hparams = load_classifier(cfg.ckpt_path)
    with open_dict(cfg.data):
        for key, value in data_hparams.items():
            if key in cfg.data and key not in LOADER_ARGS:
                cfg.data[key] = value
    validate(cfg)
    datamodule = build(cfg.data, "data")
    net_shape = model.hparams["net"].get("input_shape")
    data_shape = getattr(datamodule, "input_shape", None)
    if net_shape is not None and data_shape is not None and list(net_shape) != list(data_shape):
        raise UserError(
            f"ckpt_path={cfg.ckpt_path}: its net takes inputs {list(net_shape)} but "
            f"data ({cfg.data._target_}) gives {list(data_shape)}; select the data group the "
            "checkpoint was trained on (data=...)"
        )
    if model.hparams["num_classes"] != getattr(
        datamodule, "num_classes", model.hparams["num_classes"]
    ):
        raise UserError(
            f"ckpt_path={cfg.ckpt_path}: {model.hparams['num_classes']} classes, but data has "
            f"{datamodule.num_classes}; select the data group the checkpoint was trained on"
        )
    datamodule.prepare_data()
    datamodule.setup("test")
    return model, datamodule


def export(cfg: DictConfig) -> dict[str, Any]:
    require_ckpt(cfg)
    import torch

    from fasttrain.build import build
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
