"""python -m fasttrain.prepare: a data set's splits as WebDataset shards, or a text corpus's
token memmaps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fasttrain.config.errors import UserError


def prepare(cfg: Any) -> dict[str, Any]:
    """python -m fasttrain.prepare data=... output_dir=SHARDS: the data module's train, val and
    test splits as WebDataset shards (fasttrain.data.shards), for data=shards; data=text: its
    token memmaps (no output_dir: they go to data.cache_dir, where training reads them)."""
    from omegaconf import OmegaConf
    from rich.console import Console

    from fasttrain.assemble import build
    from fasttrain.config.schema import validate
    from fasttrain.data.shards import write_shards

    validate(cfg, entry="prepare")  # also here: tests call the task directly
    datamodule = build(cfg.data, "data")
    if hasattr(datamodule, "token_folder"):  # data=text: its token memmaps, in its cache_dir
        folder = datamodule.token_folder()
        Console(soft_wrap=True).print(f"[bold]token memmaps[/] {folder}")
        return {"folder": str(folder)}
    if OmegaConf.is_missing(cfg, "output_dir") or not cfg.output_dir:
        raise UserError(
            "output_dir is required: python -m fasttrain.prepare data=... output_dir=DIR"
        )
    if not hasattr(datamodule, "encoded"):
        raise UserError(f"data: {cfg.data._target_} holds no image files to write as shards; "
                        "prepare takes data=image_folder or data=cifar10")  # fmt: skip
    meta = write_shards(datamodule, Path(cfg.output_dir), int(cfg.shard_size))
    counts = ", ".join(f"{s} {sum(v['counts'])} in {len(v['shards'])}"
                       for s, v in meta["splits"].items())  # fmt: skip
    Console(soft_wrap=True).print(
        f"[bold]shards[/] {cfg.output_dir} ({counts}); train with: python train.py data=shards "
        f"data.path={cfg.output_dir} data.num_classes={len(meta['class_names'])}"
    )
    return meta
