"""What every image data set shares: decoding, augmentation and the loaders of uint8 batches.

Images are decoded, resized and augmented in the loader's worker processes (Pillow), and a
batch crosses to the device as uint8 [B, C, H, W], in pinned memory when a GPU takes it: a
quarter of the bytes of float32. The model converts and normalises it there (the task's
`input_mean`/`input_std`, interpolated from `data.mean`/`data.std`), so the normalisation is
stored with the model and evaluate, export and predict apply the same.

JPEGs are decoded at reduced size when the network's input is much smaller than the file
(Pillow's `draft`, a DCT-domain downscale): a 2-4x cheaper decode for large photos.

Pixels are integers on every path (8-bit as decoded, 16-bit scaled to 8, floating-point images
refused: `upright_8bit`), so image data cannot carry NaN or inf and is not checked for them as
the in-memory arrays are (fasttrain.data.checks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from fasttrain.config.domains import AtLeast, NonNegative, Range, Shape, check_arguments
from fasttrain.config.errors import ConfigError, UserError
from fasttrain.data.base import (
    Auto,
    BatchSize,
    Classes,
    PrefetchFactor,
    Seed,
    Workers,
    resolve_num_workers,
    resolve_pin_memory,
    worker_init,
)
from fasttrain.data.prefetch import PREFETCHING
from fasttrain.data.resumable import ResumableLoader, first_epoch, position_seed

Crop = Literal["none", "resized", "pad"]
# What Pillow decodes in every build; other files in a class folder are ignored.
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm")
ImageLike = Any  # a PIL.Image.Image or a uint8 array [H, W, C]
# Normalisation in pixel units, one value or one per channel (the count is checked by hand: it
# follows data.channels).
PER_CHANNEL = "one value, or one per channel"
Mean = Annotated[float | Sequence[float], Range(what="a mean", note=PER_CHANNEL)]
Std = Annotated[float | Sequence[float], Range(0, low_open=True, what="a std", note=PER_CHANNEL)]
# Two numbers each: their count (and scale's low <= high) is checked by hand.
ImageSize = Annotated[Sequence[int], Range(1, what="[H, W], ints")]
Scale = Annotated[Sequence[float], Range(0, 1, low_open=True, what="[low, high]")]


def pillow() -> Any:
    """PIL.Image, or one line saying which extra provides it."""
    try:
        from PIL import Image
    except ImportError:
        raise UserError("image data sets need Pillow: pip install -e '.[data]'") from None
    return Image


class ImageTransform:
    """An image -> uint8 tensor [C, H, W] of the network's input size.

    Evaluation (train=False): the largest centred crop of the target's aspect ratio, resized.
    Training adds the configured augmentation: `crop="resized"` (a random area `scale` of the
    image with aspect 3/4..4/3, resized: Inception-style), `crop="pad"` (zero-pad by `padding`
    then a random crop back to size: CIFAR-style), and a horizontal flip with `flip`. Random
    draws use the generator given with each image (one per sample, seeded by its position).
    """

    def __init__(
        self,
        size: Sequence[int],
        channels: Annotated[int, AtLeast(1)],
        train: bool = False,
        crop: Crop = "none",
        padding: int = 4,
        scale: Sequence[float] = (0.35, 1.0),
        flip: bool = False,
    ) -> None:
        self.height, self.width = int(size[0]), int(size[1])
        self.mode = "RGB" if channels == 3 else "L"
        self.crop = crop if train else "none"
        self.flip = flip and train
        self.padding, self.scale = padding, (float(scale[0]), float(scale[1]))

    def __call__(self, image: ImageLike, generator: torch.Generator | None = None) -> torch.Tensor:
        """`generator`: where random draws come from (fasttrain.data.images.Images seeds one per
        sample); None: torch's default one."""
        # already the input size and channels (CIFAR): no Pillow
        pixels = image if self._fits(image) else self._resized(image, generator)
        if self.crop == "pad":
            pixels = self._pad_crop(pixels, generator)
        if self.flip and torch.rand((), generator=generator) < 0.5:
            pixels = pixels[:, ::-1]
        if pixels.ndim == 2:
            pixels = pixels[:, :, None]
        # [H, W, C] -> [C, H, W], contiguous and writable (Pillow's arrays are read-only)
        return torch.from_numpy(np.require(pixels.transpose(2, 0, 1), requirements=["C", "W"]))

    def _fits(self, image: ImageLike) -> bool:
        if not isinstance(image, np.ndarray) or image.shape[:2] != (self.height, self.width):
            return False
        return (image.shape[2] if image.ndim == 3 else 1) == (3 if self.mode == "RGB" else 1)

    def _resized(self, image: ImageLike, generator: torch.Generator | None = None) -> np.ndarray:
        Image = pillow()
        if isinstance(image, np.ndarray):
            image = Image.fromarray(image)
        width, height = image.size
        box = self._box(width, height, generator)
        # JPEG only (a no-op for other formats): decode at the smallest DCT scale that still
        # gives the crop at least the output's resolution.
        need = (
            math.ceil(self.width * image.size[0] / (box[2] - box[0])),
            math.ceil(self.height * image.size[1] / (box[3] - box[1])),
        )
        before = image.size
        image.draft(self.mode, need)
        if image.size != before:
            sx, sy = image.size[0] / before[0], image.size[1] / before[1]
            box = (box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy)
        if image.mode != self.mode:
            image = image.convert(self.mode)  # palette, RGBA, LA, CMYK, 16-bit ...
        out = image.resize((self.width, self.height), Image.Resampling.BILINEAR, box=box)
        return np.asarray(out, dtype=np.uint8)

    def _box(
        self, width: int, height: int, generator: torch.Generator | None = None
    ) -> tuple[float, float, float, float]:
        """(left, top, right, bottom) of the region that becomes the output."""
        g = generator
        if self.crop == "resized":
            for _ in range(10):  # torchvision's RandomResizedCrop: rejection sampling
                area = width * height * float(torch.empty(()).uniform_(*self.scale, generator=g))
                ratios = (math.log(3 / 4), math.log(4 / 3))
                log_ratio = float(torch.empty(()).uniform_(*ratios, generator=g))
                w = round(math.sqrt(area * math.exp(log_ratio)))
                h = round(math.sqrt(area / math.exp(log_ratio)))
                if 0 < w <= width and 0 < h <= height:
                    left = int(torch.randint(0, width - w + 1, (), generator=g))
                    top = int(torch.randint(0, height - h + 1, (), generator=g))
                    return (left, top, left + w, top + h)
        # the largest centred region with the output's aspect ratio
        aspect = self.width / self.height
        cw, ch = min(width, height * aspect), min(height, width / aspect)
        return ((width - cw) / 2, (height - ch) / 2, (width + cw) / 2, (height + ch) / 2)

    def _pad_crop(self, pixels: np.ndarray, generator: torch.Generator | None = None) -> np.ndarray:
        p = self.padding
        pad = ((p, p), (p, p)) + (((0, 0),) if pixels.ndim == 3 else ())
        padded = np.pad(pixels, pad)
        top, left = (int(v) for v in torch.randint(0, 2 * p + 1, (2,), generator=generator))
        return padded[top : top + self.height, left : left + self.width]


class ImageDataModule(L.LightningDataModule):
    """Base of the image data sets: checks the shared knobs and serves uint8 batches.

    Args:
        num_classes: classes (the model interpolates it); checked against the data.
        input_shape: [channels, *image_size] (the model interpolates it; conf/data/ derives it).
        channels: 3 (RGB) or 1 (grey); every image is converted to it.
        image_size: [H, W] of the network's input.
        mean, std: normalisation in pixel units 0..255, one value or one per channel; the model
            applies it on the device ((x - mean) / std), not this module.
        crop: training augmentation: none | resized (random resized crop) | pad (pad-and-crop).
        padding: pixels of zero padding for crop=pad.
        scale: range of the image area a random resized crop keeps.
        flip: random horizontal flips in training.
        batch_size, num_workers, pin_memory, persistent_workers, prefetch_factor,
            device_prefetch, seed: as fasttrain.data.base.TensorDataModule.
    """

    def __init__(
        self,
        num_classes: Classes,
        input_shape: Shape,
        channels: Literal[1, 3] = 3,
        image_size: ImageSize = (32, 32),
        mean: Mean = 127.5,
        std: Std = 127.5,
        crop: Crop = "none",
        padding: Annotated[int, NonNegative] = 4,
        scale: Scale = (0.35, 1.0),
        flip: bool = True,
        batch_size: BatchSize = 64,
        num_workers: Workers | Auto = "auto",
        pin_memory: bool | Auto = "auto",
        persistent_workers: bool = True,
        prefetch_factor: PrefetchFactor = 2,
        device_prefetch: bool = False,
        seed: Seed = 42,
    ) -> None:
        super().__init__()
        check_arguments(ImageDataModule.__init__, locals())
        if len(image_size) != 2:
            raise ConfigError("image_size", list(image_size), "expected [H, W], ints >= 1")
        if list(input_shape) != [channels, *image_size]:
            raise ConfigError(
                "input_shape", list(input_shape),
                f"expected [channels, *image_size] = {[channels, *image_size]} (set data.channels"
                " and data.image_size; input_shape follows them)",
            )  # fmt: skip
        if len(scale) != 2 or scale[0] > scale[1]:
            raise ConfigError(
                "scale", list(scale), "expected [low, high] with 0 < low <= high <= 1"
            )
        self.mean, self.std = (
            _per_channel(mean, "mean", channels),
            _per_channel(std, "std", channels),
        )
        self.num_classes, self.channels = num_classes, channels
        self.input_shape, self.image_size = tuple(input_shape), (image_size[0], image_size[1])
        self.augment: dict[str, Any] = {
            "crop": crop,
            "padding": padding,
            "scale": tuple(scale),
            "flip": flip,
        }
        self.batch_size, self.seed = batch_size, seed
        self.num_workers = resolve_num_workers(num_workers)
        self.pin_memory = resolve_pin_memory(pin_memory)
        self.persistent_workers, self.prefetch_factor = persistent_workers, prefetch_factor
        self.device_prefetch = device_prefetch
        self.class_names: list[str] = []
        self.splits: dict[str, Dataset[Any]] = {}

    def transform(self, train: bool) -> ImageTransform:
        return ImageTransform(self.image_size, self.channels, train=train, **self.augment)

    def input_statistics(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean, std) in pixel units, [C, 1, 1] or scalars: net input = (raw - mean) / std,
        as the model computes it. Exports carry them and take raw pixels (float32 0..255)."""
        return _shaped(self.mean), _shaped(self.std)

    def make_splits(self) -> dict[str, Any]:
        """{"train", "val", "test"} -> datasets of (uint8 [C, H, W], int label)."""
        raise NotImplementedError

    def setup(self, stage: str | None = None) -> None:
        if not self.splits:
            self.splits = self.make_splits()

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        workers = self.num_workers
        rank = self.trainer.global_rank if self.trainer else 0
        cls: type[DataLoader[Any]] = ResumableLoader if shuffle else DataLoader
        extra: dict[str, Any] = (
            {"seed": self.seed, "epoch": first_epoch(self.trainer)} if shuffle else {}
        )
        device = self.trainer.strategy.root_device if self.trainer is not None else None
        if self.device_prefetch and device is not None and device.type == "cuda":
            cls, extra = PREFETCHING[cls], {**extra, "prefetch_to": device}
        return cls(
            self.splits[split], **extra, batch_size=self.batch_size, num_workers=workers,
            worker_init_fn=worker_init(rank), pin_memory=self.pin_memory,
            persistent_workers=self.persistent_workers and workers > 0,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
        )  # fmt: skip

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.loader("test", shuffle=False)


class Images(Dataset):
    """(uint8 [C, H, W], label) from a list of items that `load` turns into images.

    `positioned`: a training loader (fasttrain.data.resumable.EpochTagged) asks for item
    epoch x N + i; its random augmentation is drawn from a generator seeded by (seed, epoch, i),
    so a run resumed mid-epoch (or one whose loader workers restarted) augments every image as
    the uninterrupted run did. Other loaders ask for plain indices (epoch 0).
    """

    positioned = True

    def __init__(self, items: Any, labels: Any, load: Any, transform: Any, seed: int = 0) -> None:
        self.items, self.labels, self.load, self.transform = items, labels, load, transform
        self.seed = seed

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, k: int) -> tuple[torch.Tensor, int]:
        epoch, i = divmod(int(k), len(self.items))
        generator = torch.Generator().manual_seed(position_seed(self.seed, epoch, i))
        return self.transform(self.load(self.items[i]), generator), int(self.labels[i])


def open_image(path: Path) -> Any:
    """The decoded image at `path` (Pillow reads lazily: this is where the pixels are read),
    upright and 8-bit (`upright_8bit`); an unreadable file is one UserError naming it."""
    Image = pillow()
    try:
        image = Image.open(path)
        image.load()
    except (OSError, SyntaxError, ValueError) as err:
        raise UserError(f"data.path: {path} is not a readable image ({err})") from None
    return upright_8bit(image, str(path))


# Pillow modes of one channel wider than 8 bits: 16-bit PNG/TIFF ("I;16" variants, or "I").
HIGH_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def upright_8bit(image: Any, name: str) -> Any:
    """`image` as it is meant to be seen, in 8 bits: rotated or mirrored as its EXIF orientation
    says (a phone photo tagged "rotate 90"), and a 16-bit grey image scaled to 0..255 (Pillow's
    own conversion clips it at 255: a 16-bit gradient came out almost all white). Every path that
    decodes an image (training, evaluate, predict, shards) goes through here."""
    from PIL import ImageOps

    image = ImageOps.exif_transpose(image)
    if image.mode in HIGH_BIT_MODES:
        wide = np.asarray(image, dtype=np.float64)
        if wide.min() < 0 or wide.max() > 65535:
            raise UserError(f"data.path: {name} holds {image.mode} pixels outside 0..65535, "
                            "which have no 8-bit scale; convert it to 8 or 16 bits")  # fmt: skip
        return pillow().fromarray(np.round(wide / 257).astype(np.uint8), "L")
    if image.mode == "F":
        raise UserError(f"data.path: {name} holds floating-point pixels (mode F), which have no "
                        "fixed 8-bit scale; convert it to an 8- or 16-bit image")  # fmt: skip
    return image


def _per_channel(values: float | Sequence[float], name: str, channels: int) -> list[float]:
    flat = [float(values)] if isinstance(values, (int, float)) else [float(v) for v in values]
    if len(flat) not in (1, channels):
        raise ConfigError(name, values, f"expected one value or {channels} (one per channel)")
    return flat


def _shaped(values: list[float]) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.float32)
    return t.reshape(()) if t.numel() == 1 else t.view(-1, 1, 1)


def stratified_split(
    labels: Sequence[int], fractions: Sequence[float], seed: int
) -> list[list[int]]:
    """Indices of `labels` cut into len(fractions) + 1 parts, every class in proportion, fixed by
    `seed`: part k gets round(N * fractions[k]) images in all (rounded over the running total, so
    small classes still add up), the first part the rest, keeping one of each class at least."""
    gen = torch.Generator().manual_seed(seed)
    parts: list[list[int]] = [[] for _ in range(len(fractions) + 1)]
    by_class: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        by_class.setdefault(int(label), []).append(i)
    seen = 0
    for _label, members in sorted(by_class.items()):
        order = [members[j] for j in torch.randperm(len(members), generator=gen).tolist()]
        start = 0
        for k, frac in enumerate(fractions, start=1):
            due = math.floor(frac * (seen + len(order)) + 0.5) - math.floor(frac * seen + 0.5)
            take = max(0, min(due, len(order) - start - 1))
            parts[k] += order[start : start + take]
            start += take
        parts[0] += order[start:]
        seen += len(order)
    return [sorted(p) for p in parts]


def shuffled(n: int, seed: int) -> list[int]:
    """0..n-1 in an order fixed by `seed`."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
