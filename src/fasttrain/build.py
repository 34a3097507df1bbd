"""Config -> objects, for the entry points only (components never see the config).

Every failure of a constructor on bad input becomes one UserError that names the override,
e.g. `data.batch_size=0: expected an int >= 1`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig, open_dict
from rich.console import Console
from rich.table import Table

from fasttrain.errors import ConfigError, UserError
from fasttrain.schema import validate

__all__ = ["build", "build_all", "report", "restore", "validate"]


def build(node: DictConfig, path: str, **kwargs: Any) -> Any:
    """Instantiate one `_target_` node; arguments reach the class as plain lists and dicts."""
    try:
        return instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        # Hydra names the failing nested node (`full_key: net`) relative to `node`.
        key = re.search(r"full_key: (\S+)", str(err))
        where = f"{path}.{key.group(1)}" if key and key.group(1) != path else path
        if isinstance(cause, ConfigError):
            raise cause.at(where) from None
        if isinstance(cause, (UserError, ValueError, MisconfigurationException)):
            raise UserError(f"{where}: {cause}") from None
        raise


def build_all(group: DictConfig | None, path: str) -> list[Any]:
    """Build each named entry of a group like `callbacks:` or `logger:`; null entries skip."""
    if not group:
        return []
    return [build(node, f"{path}.{name!s}") for name, node in group.items()
            if isinstance(node, DictConfig) and "_target_" in node]  # fmt: skip


def restore(cfg: DictConfig) -> tuple[Any, Any]:
    """(Classifier in eval mode, set-up data module) for `cfg.ckpt_path`: the entry points that
    start from a checkpoint (evaluate, export, predict) share it. The data split comes from the
    checkpoint (seed, fractions, ...), so the test set is the one the run was tested on; loader
    knobs stay this machine's."""
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


@rank_zero_only
def report(output_dir: str, metrics: dict[str, float], ckpt: str | None) -> None:
    """Write metrics.json in the run dir; print the final metrics, where the run went, and the
    command that opens it in TensorBoard."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(
        json.dumps({"metrics": metrics, "checkpoint": ckpt}, indent=2)
    )
    shown = {k: v for k, v in metrics.items() if k.startswith(("test/", "val/"))}
    table = Table(title="final metrics", title_justify="left")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name in sorted(shown):
        table.add_row(name, f"{shown[name]:.4f}")
    console = Console(soft_wrap=True)  # long paths stay on one line, easy to copy
    console.print(table)
    console.print(f"[bold]run dir[/]     {output_dir}")
    if ckpt:
        console.print(f"[bold]checkpoint[/]  {ckpt}")
    tb_dir = out / "tensorboard"
    if tb_dir.is_dir():
        console.print(f"[bold]TensorBoard[/] tensorboard --logdir {tb_dir} --host 127.0.0.1")
