"""Small data sets in the exact layouts the image data modules read, made by the tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

# (size, PIL mode, suffix): mixed sizes, modes and formats, as real folders have them.
KINDS = [((40, 30), "RGB", ".jpg"), ((24, 36), "L", ".png"), ((33, 33), "RGBA", ".png"),
         ((50, 20), "P", ".gif"), ((64, 48), "RGB", ".jpeg")]  # fmt: skip


def image(path: Path, size: tuple[int, int], mode: str, value: int) -> None:
    """A flat-ish image whose mean level encodes `value` (so labels are learnable)."""
    from PIL import Image

    gen = np.random.default_rng(value * 7919 + size[0])
    pixels = np.clip(value + gen.integers(-20, 20, (size[1], size[0], 3)), 0, 255).astype(np.uint8)
    img = Image.fromarray(pixels, "RGB")
    img = img.convert(mode) if mode != "P" else img.convert("P", palette=Image.Palette.ADAPTIVE)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path)


def write_image_folder(
    root: Path,
    classes: tuple[str, ...] = ("cat", "dog", "fish"),
    per_class: int = 10,
    splits: tuple[str, ...] = (),
) -> Path:
    """root/<class>/ (or root/<split>/<class>/ for each of `splits`) with `per_class` images of
    mixed sizes, modes and formats, and a non-image file in each folder."""
    for split in splits or ("",):
        for c, name in enumerate(classes):
            folder = root / split / name
            for i in range(per_class):
                size, mode, suffix = KINDS[i % len(KINDS)]
                image(folder / f"{name}_{i:03d}{suffix}", size, mode, 40 + 80 * c)
            (folder / "notes.txt").write_text("not an image")
    return root


def write_cifar10(root: Path, per_batch: int = 20, test: int = 20) -> Path:
    """root/cifar-10-batches-py/ as the official python archive has it: data_batch_1..5 and
    test_batch (pickled dicts of bytes keys: b"data" uint8 [N, 3072], b"labels" list of int),
    and batches.meta (b"label_names"). Class c's pixels are around 20 + 23 c."""
    import pickle

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    gen = np.random.default_rng(0)
    names = ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5",
             "test_batch"]  # fmt: skip
    for name in names:
        n = test if name == "test_batch" else per_batch
        labels = [int(v) for v in np.arange(n) % 10]
        data = np.clip(
            20 + 23 * np.array(labels)[:, None] + gen.integers(-10, 10, (n, 3072)), 0, 255
        )
        batch = {b"batch_label": name.encode(), b"labels": labels,
                 b"data": data.astype(np.uint8), b"filenames": [b"x.png"] * n}  # fmt: skip
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    meta = {b"label_names": [n.encode() for n in CIFAR_NAMES], b"num_cases_per_batch": per_batch,
            b"num_vis": 3072}  # fmt: skip
    (folder / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return root


CIFAR_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
               "truck"]  # fmt: skip


def write_for(cfg) -> None:
    """Write what a composed config's data module reads (at data.path), if it reads files and
    they are not there: tests/test_configs.py composes every conf/ file with it."""
    target = str(cfg.get("data", {}).get("_target_", ""))
    path = Path(str(cfg.data.path)) if "path" in cfg.get("data", {}) else None
    if path is None or path.exists():
        return
    if target.endswith("ImageFolderDataModule"):
        # num_classes counts the folder's classes by default: 3 of them, where none exist yet
        given = OmegaConf.select(cfg, "data.num_classes", throw_on_resolution_failure=False)
        names = tuple(f"class{c}" for c in range(int(given or 3)))
        write_image_folder(path, names, per_class=4)
    elif target.endswith("Cifar10DataModule"):
        write_cifar10(path)
    elif target.endswith("ShardsDataModule"):
        write_shards(path, int(cfg.data.num_classes))


def write_shards(path: Path, num_classes: int) -> Path:
    """Shards as `python -m fasttrain.prepare` writes them, from a small image folder."""
    from fasttrain.data.image_folder import ImageFolderDataModule
    from fasttrain.data.shards import write_shards as write

    names = tuple(f"class{c}" for c in range(num_classes))
    source = write_image_folder(path.parent / f"{path.name}_source", names, per_class=4)
    dm = ImageFolderDataModule(str(source), num_classes, [3, 32, 32], num_workers=0)
    write(dm, path, shard_size=8)
    return path
