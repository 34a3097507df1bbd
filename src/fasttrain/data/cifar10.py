"""CIFAR-10 from its official files: `data=cifar10 data.path=DIR`.

DIR holds the python version (`cifar-10-batches-py/`: data_batch_1..5, test_batch, batches.meta,
as the archive unpacks) or the binary one (`cifar-10-batches-bin/`: data_batch_1..5.bin,
test_batch.bin); either folder's files directly in DIR work too. The python batches are
pickles: they are read with an unpickler that builds plain containers, bytes and numpy uint8
arrays only and refuses any other object, as checkpoints are read. `download=true` fetches the
official python archive into DIR when the files are not there and checks its MD5.

Splits: train = data_batch_1..5 less a stratified `val_fraction` (fixed by `seed`) for
validation; test = test_batch, which never picks a checkpoint.

`on_device=true` holds the decoded uint8 images as tensors on the accelerator (150 MB for the
training set) and serves them like the in-memory data sets (fasttrain.data.batches): no loader
workers, no copy per step. The pad-and-crop and flips then run there, on the whole batch, in
training only (fasttrain.data.augment).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import pickle
import shutil
import tarfile
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from fasttrain.config.domains import Shape, check_arguments
from fasttrain.config.errors import ConfigError, UserError
from fasttrain.data.augment import PadCropFlip, augment_training_batch
from fasttrain.data.base import Classes, Fraction
from fasttrain.data.batches import Batched, device_loader
from fasttrain.data.images import ImageDataModule, Images, pillow, shuffled, stratified_split

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
MD5 = "c58f30108f718f92721af3b95e74349a"  # published with the archive
TRAIN = [f"data_batch_{i}" for i in range(1, 6)]
TEST = "test_batch"
NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


class Cifar10DataModule(ImageDataModule):
    """CIFAR-10 (see module doc): 60,000 RGB images of 32x32 in 10 classes.

    Args:
        path: the folder with the files (or where `download` puts them).
        num_classes: 10 (the model interpolates it).
        input_shape: [channels, *image_size] (conf/data/cifar10.yaml derives it).
        download: fetch the official archive into `path` when the files are not there.
        val_fraction: share of the training batches held out for validation, per class.
        on_device: hold the splits on the accelerator and augment batches there (crop "pad" or
            "none", flip); needs num_workers 0 or auto.
        **images: channels, image_size, mean, std, augmentation and loader knobs
            (fasttrain.data.images.ImageDataModule).
    """

    def __init__(
        self,
        path: str,
        num_classes: Classes,
        input_shape: Shape,
        download: bool = False,
        val_fraction: Fraction = 0.1,
        on_device: bool = False,
        **images: Any,
    ) -> None:
        check_arguments(Cifar10DataModule.__init__, locals())
        _check_on_device(on_device, images)
        super().__init__(num_classes, input_shape, **images)
        if num_classes != 10:  # the data set's own count (the model interpolates it from here)
            raise ConfigError("num_classes", num_classes, "CIFAR-10 has 10 classes")
        self.path, self.val_fraction = Path(path), val_fraction
        self.folder, self.binary = locate(self.path)
        if self.folder is None and download:
            fetch(self.path)
            self.folder, self.binary = locate(self.path)
        if self.folder is None:
            raise ConfigError(
                "path", path,
                "no CIFAR-10 files there: put the python version's cifar-10-batches-py/ "
                f"(data_batch_1..5, test_batch) in it, from {URL}, or set data.download=true",
            )  # fmt: skip
        self.class_names = list(NAMES)
        self.arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.on_device = on_device
        self._moved: dict[str, Batched] = {}  # the splits on the device, as they are first used
        self.device_augment: PadCropFlip | None = None
        if on_device:
            self.num_workers, self.pin_memory = 0, False  # batches are gathered on the device
            pad = self.augment["padding"] if self.augment["crop"] == "pad" else 0
            if pad or self.augment["flip"]:
                self.device_augment = PadCropFlip(pad, self.augment["flip"])
        self.save_hyperparameters()

    def load(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{"train", "val", "test"} -> (uint8 [N, 32, 32, 3], int64 [N]); read once."""
        if self.arrays:
            return self.arrays
        assert self.folder is not None
        read = read_binary if self.binary else read_pickled
        parts = [read(self.folder / (f"{name}.bin" if self.binary else name)) for name in TRAIN]
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        train, val = stratified_split(y.tolist(), [self.val_fraction], self.seed)
        test = read(self.folder / (f"{TEST}.bin" if self.binary else TEST))
        self.arrays = {"train": (x[train], y[train]), "val": (x[val], y[val]), "test": test}
        return self.arrays

    def make_splits(self) -> dict[str, Any]:
        if self.on_device:  # uint8 [N, 32, 32, 3] -> [N, 3, 32, 32], augmented on the device
            return {
                split: Batched(torch.from_numpy(x).permute(0, 3, 1, 2).contiguous(),
                               torch.from_numpy(y))
                for split, (x, y) in self.load().items()
            }  # fmt: skip
        return {
            split: Images(x, y, _row, self.transform(split == "train"), self.seed)
            for split, (x, y) in self.load().items()
        }

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        if not self.on_device:
            return super().loader(split, shuffle)
        splits: dict[str, TensorDataset] = dict(self.splits)  # type: ignore[arg-type]
        return device_loader(
            splits, self._moved, split, shuffle, self.trainer, self.seed, self.batch_size
        )

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Lightning's hook after a batch reached the device (a no-op move when it lives there).
        return augment_training_batch(self, batch, self.device_augment, self.seed)

    def encoded(self, split: str) -> Iterator[tuple[str, bytes, int]]:
        """(format, PNG bytes, label) of each image of `split` (for shards)."""
        Image = pillow()
        x, y = self.load()[split]
        for i in shuffled(len(y), self.seed):  # each shard then holds a mix of classes
            buffer = io.BytesIO()
            Image.fromarray(x[i]).save(buffer, format="PNG")
            yield "png", buffer.getvalue(), int(y[i])


def _check_on_device(on_device: Any, images: dict[str, Any]) -> None:
    if not on_device:
        return
    workers = images.get("num_workers", "auto")
    if workers not in ("auto", 0):
        raise ConfigError(
            "on_device", on_device,
            f"batches are gathered on the device, in the training process: set "
            f"data.num_workers=0 (or auto), not {workers}",
        )  # fmt: skip
    if images.get("crop", "none") == "resized":
        raise ConfigError(
            "on_device", on_device,
            "augmentation on the device does pad-and-crop and flips: set data.crop=pad or none, "
            "or data.on_device=false for crop=resized (done in loader workers)",
        )  # fmt: skip
    # The images go to the device as stored: resizing or converting them there would differ
    # from the loader path evaluate and export take (the same checkpoint, other test inputs).
    size, channels = list(images.get("image_size", [32, 32])), images.get("channels", 3)
    if size != [32, 32] or channels != 3:
        raise ConfigError(
            "on_device", on_device,
            f"keeps CIFAR-10 as stored, 32x32 RGB, but data.image_size={size} "
            f"data.channels={channels}; set data.image_size=[32,32] data.channels=3, or "
            "data.on_device=false to resize in loader workers",
        )  # fmt: skip


def _row(pixels: np.ndarray) -> np.ndarray:
    return pixels  # the dataset's items are the images themselves


def locate(path: Path) -> tuple[Path | None, bool]:
    """(the folder with the batches, whether they are the binary version), or (None, False)."""
    for folder in (path / "cifar-10-batches-py", path / "cifar-10-batches-bin", path):
        if all((folder / name).is_file() for name in [*TRAIN, TEST]):
            return folder, False
        if all((folder / f"{name}.bin").is_file() for name in [*TRAIN, TEST]):
            return folder, True
    return None, False


class _Restricted(pickle.Unpickler):
    """Builds plain containers, bytes and numpy arrays; refuses every other global."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = {
            ("numpy", "ndarray"): np.ndarray,
            ("numpy", "dtype"): np.dtype,
            ("numpy.core.multiarray", "_reconstruct"): _reconstruct(),
            ("numpy._core.multiarray", "_reconstruct"): _reconstruct(),
            ("_codecs", "encode"): _latin1,  # how Python 3 pickles bytes at protocol 2
        }
        if (module, name) not in allowed:
            raise pickle.UnpicklingError(f"refused global {module}.{name}")
        return allowed[(module, name)]


def _reconstruct() -> Any:
    # The CIFAR files (numpy 1) name numpy.core.multiarray, which numpy 2 calls numpy._core.
    try:
        from numpy._core import multiarray
    except ImportError:
        from numpy.core import multiarray  # type: ignore[no-redef]
    return multiarray._reconstruct


def _latin1(text: str, encoding: str = "latin1") -> bytes:
    if encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"refused encoding {encoding}")
    return text.encode("latin1")


def read_pickled(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """One python-version batch -> (uint8 [N, 32, 32, 3], int64 [N])."""
    try:
        with file.open("rb") as f:
            batch = _Restricted(f, encoding="bytes").load()
    except Exception as err:
        raise UserError(f"data.path: {file} is not a CIFAR-10 python batch ({err})") from None
    data = batch.get(b"data") if isinstance(batch, dict) else None
    labels = batch.get(b"labels") if isinstance(batch, dict) else None
    return _checked(file, data, labels)


def read_binary(file: Path) -> tuple[np.ndarray, np.ndarray]:
    """One binary-version batch (records of 1 label byte + 3072 pixel bytes) -> as above."""
    raw = np.fromfile(file, dtype=np.uint8)
    if raw.size == 0 or raw.size % 3073:
        raise UserError(f"data.path: {file} is not a CIFAR-10 binary batch ({raw.size} bytes)")
    records = raw.reshape(-1, 3073)
    return _checked(file, records[:, 1:], records[:, 0].tolist())


def _checked(file: Path, data: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    ok = isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
    ok = ok and data.shape[1] == 3072 and isinstance(labels, list) and len(labels) == len(data)
    y = np.asarray(labels if ok else [], dtype=np.int64)
    if not ok or (len(y) and (y.min() < 0 or y.max() > 9)):
        raise UserError(
            f"data.path: {file} is not a CIFAR-10 batch (expected uint8 data [N, 3072] and N "
            "labels in 0..9)"
        )
    # rows are 1024 red, 1024 green, 1024 blue values: [N, 3, 32, 32] -> [N, 32, 32, 3]
    return np.ascontiguousarray(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)), y


def fetch(path: Path, url: str | None = None, md5: str | None = None) -> None:
    """Download the archive into `path`, check its MD5, unpack cifar-10-batches-py/ there.

    One process at a time (a lock file: DDP ranks started together by torchrun or SLURM); the
    unpacked folder appears in one rename, so a failure leaves nothing half-written.
    """
    url, md5 = url or URL, md5 or MD5
    made = [p for p in (path, *path.parents) if not p.exists()]  # what a failure takes back
    path.mkdir(parents=True, exist_ok=True)
    try:
        _fetch_locked(path, url, md5)
    except BaseException:
        (path / ".download.lock").unlink(missing_ok=True)
        for folder in made:  # deepest first; only those this call made, and only if empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    (path / ".download.lock").unlink(missing_ok=True)


def _fetch_locked(path: Path, url: str, md5: str) -> None:
    with _locked(path / ".download.lock"):
        if locate(path)[0] is not None:  # another rank fetched it meanwhile
            return
        with tempfile.TemporaryDirectory(dir=path) as tmp:
            archive = Path(tmp) / "cifar-10-python.tar.gz"
            try:
                with urllib.request.urlopen(url, timeout=30) as response, archive.open("wb") as f:
                    shutil.copyfileobj(response, f)
            except Exception as err:
                raise UserError(
                    f"data.download=true: could not fetch {url} ({err}); offline, put the python "
                    f"version's cifar-10-batches-py/ folder (data_batch_1..5, test_batch) in {path}"
                ) from None
            digest = hashlib.md5(archive.read_bytes()).hexdigest()
            if digest != md5:
                raise UserError(
                    f"data.download=true: {url} has MD5 {digest}, not the published {md5}; "
                    "nothing was unpacked"
                )
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")  # no paths outside tmp, no links, no devices
            unpacked = Path(tmp, "cifar-10-batches-py")
            if locate(unpacked)[0] is None:
                raise UserError(f"data.download=true: {url} holds no cifar-10-batches-py/ batches")
            unpacked.rename(path / "cifar-10-batches-py")


@contextlib.contextmanager
def _locked(file: Path) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # Windows: no flock; ranks there download one after another anyway
        yield
        return
    with file.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
