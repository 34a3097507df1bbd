"""Images on disk, one subfolder per class: `data=image_folder data.path=DIR`.

    DIR/<class>/*.jpg|png|...              split by val_fraction/test_fraction (file hash, seed)
    DIR/train/<class>/...  [DIR/val/...]  [DIR/test/...]   the splits that are there are used

With train/ but no val/ (or no test/), that split is carved from train/ by its fraction: the
test split is never the one that picks the best checkpoint. Classes are the subfolder names,
sorted (or `classes`, in that order), scanned when the module is built: before a run writes
anything, every class folder must hold images and every image's header must read. The list is
saved with the checkpoint's data settings, so evaluate and predict map indices to the same
names. Files of other types are ignored. Pixels decode to uint8 (a floating-point image is
refused: fasttrain.data.images.upright_8bit), so no NaN or inf can reach the model from here.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Any

from fasttrain.config.domains import NonNegative, Shape, check_arguments
from fasttrain.config.errors import ConfigError, UserError
from fasttrain.data.base import SPLIT_RECORD, Fraction, check_fractions
from fasttrain.data.images import (
    IMAGE_SUFFIXES,
    ImageDataModule,
    Images,
    open_image,
    pillow,
    shuffled,
)

SPLITS = ("train", "val", "test")
Files = list[tuple[Path, int]]  # (image file, class index)


class ImageFolderDataModule(ImageDataModule):
    """Class-per-subfolder images (see module doc).

    Args:
        path: the folder.
        num_classes: the number of class folders (checked; the model interpolates it).
        input_shape: [channels, *image_size] (conf/data/image_folder.yaml derives it).
        classes: class folder names in label order; None: every subfolder, sorted. Folders not
            named are ignored.
        val_fraction, test_fraction: shares of each class held out where the folder has no
            val/ or test/ split of its own.
        **images: channels, image_size, mean, std, augmentation and loader knobs
            (fasttrain.data.images.ImageDataModule).
    """

    def __init__(
        self,
        path: str,
        # Not Classes (>= 2): the count comes from the folder, and the folder's own error (one
        # class folder) says more; ImageDataModule checks it >= 2 after the scan.
        num_classes: Annotated[int, NonNegative],
        input_shape: Shape,
        classes: Sequence[str] | None = None,
        val_fraction: Fraction = 0.1,
        test_fraction: Fraction = 0.1,
        **images: Any,
    ) -> None:
        # The folder first: its own errors (no such folder, one class folder) say more than
        # the class count derived from it (data.num_classes counts the folders by default).
        class_names, files = scan(Path(path), classes)
        super().__init__(num_classes, input_shape, **images)
        check_arguments(ImageFolderDataModule.__init__, locals())
        check_fractions(val_fraction, test_fraction)
        self.path = Path(path)
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.class_names, self.files = class_names, files
        if len(self.class_names) != num_classes:
            shown = ", ".join(self.class_names[:8]) + (", ..." if len(self.class_names) > 8 else "")
            raise ConfigError(
                "num_classes", num_classes,
                f"{path} has {len(self.class_names)} class folders ({shown}); set "
                f"data.num_classes={len(self.class_names)}",
            )  # fmt: skip
        self.parts = self._split()
        self.save_hyperparameters()
        # The scanned list, not the null asked for: a checkpoint restores exactly these classes.
        self.hparams["classes"] = list(self.class_names)
        # What each split holds, so evaluate, predict and resume can say when the files changed.
        self.hparams[SPLIT_RECORD] = split_record(self.path, self.parts)

    def _split(self) -> dict[str, Files]:
        """{"train", "val", "test"} -> (file, label): split folders first, then fractions."""
        given = {s: self.files[s] for s in SPLITS if s in self.files}
        source = given.get("train", self.files.get("all", []))
        carve = [s for s in ("val", "test") if s not in given]
        fractions = [self.val_fraction if s == "val" else self.test_fraction for s in carve]
        names = [file.relative_to(self.path).as_posix() for file, _ in source]
        parts = hashed_split(names, fractions, self.seed)
        parts_of = dict(zip(["train", *carve], parts, strict=True))
        split = {**given, **{s: [source[i] for i in parts_of[s]] for s in ["train", *carve]}}
        for s in SPLITS:
            if not split[s]:
                frac = "val_fraction" if s == "val" else "test_fraction"
                raise ConfigError(
                    frac, getattr(self, frac),
                    f"leaves the {s} split empty ({len(source)} images in {self.path}); raise it, "
                    f"or add a {s}/ folder",
                )  # fmt: skip
        return split

    def make_splits(self) -> dict[str, Any]:
        return {
            s: Images(
                [f for f, _ in files],
                [y for _, y in files],
                open_image,
                self.transform(s == "train"),
                self.seed,
            )
            for s, files in self.parts.items()
        }

    def encoded(self, split: str) -> Iterator[tuple[str, bytes, int]]:
        """(format, file bytes, label) of each image of `split` as stored, in an order shuffled
        by `seed` (for shards: each then holds a mix of classes)."""
        files = self.parts[split]
        for i in shuffled(len(files), self.seed):
            file, label = files[i]
            yield file.suffix.lower().lstrip("."), file.read_bytes(), label


def hashed_split(names: Sequence[str], fractions: Sequence[float], seed: int) -> list[list[int]]:
    """Indices of `names` (file paths relative to the data folder) in len(fractions) + 1 parts:
    part k >= 1 takes the files whose hash of (seed, name), a number in [0, 1), falls in its
    share of the range, part 0 (train) the rest. A file's split depends on its own name and the
    seed only: adding or removing images never moves another image between splits (a
    permutation of the whole list did: one image added moved 8 of 10 test images into training).
    Class proportions hold in expectation, not exactly. A part left empty (a handful of images)
    takes the train file whose hash lies nearest its share."""
    points = [_unit_hash(seed, name) for name in names]
    bounds = list(itertools.accumulate(fractions))  # part k: [bounds[k-2], bounds[k-1])
    parts: list[list[int]] = [[] for _ in range(len(fractions) + 1)]
    for i, u in enumerate(points):
        parts[next((k + 1 for k, b in enumerate(bounds) if u < b), 0)].append(i)
    for k in range(1, len(parts)):
        if not parts[k] and len(parts[0]) > 1:
            nearest = min(parts[0], key=lambda i: abs(points[i] - bounds[k - 1]))
            parts[0].remove(nearest)
            parts[k].append(nearest)
    return parts


def _unit_hash(seed: int, name: str) -> float:
    digest = hashlib.sha256(f"{seed}\0{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_record(root: Path, parts: dict[str, Files]) -> dict[str, dict[str, Any]]:
    """{split: {"files": count, "sha256": digest of its sorted relative file names}}."""
    record = {}
    for split, files in parts.items():
        names = sorted(file.relative_to(root).as_posix() for file, _ in files)
        digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:16]
        record[split] = {"files": len(names), "sha256": digest}
    return record


def class_folders(root: Path) -> tuple[bool, Path, list[str]]:
    """(split layout?, the folder holding the class folders, their names sorted)."""
    if not root.is_dir():
        raise ConfigError("path", str(root), "no such folder")
    split_layout = (root / "train").is_dir() and any(p.is_dir() for p in (root / "train").iterdir())
    top = root / "train" if split_layout else root
    found = sorted(p.name for p in top.iterdir() if p.is_dir() and not p.name.startswith("."))
    return split_layout, top, found


def count_classes(path: str, classes: Sequence[str] | None = None) -> int:
    """`${class_count:${.path},${.classes}}` in conf/data/image_folder.yaml: the number of
    classes the folder holds (or of `classes`, when named), counted when the config resolves,
    so the model's num_classes follows the folder; the constructor checks an explicit value."""
    return len(classes) if classes else len(class_folders(Path(path))[2])


def scan(root: Path, classes: Sequence[str] | None) -> tuple[list[str], dict[str, Files]]:
    """(class names, {"train"/"val"/"test" or "all": (file, label) lists}), every error one line."""
    split_layout, top, found = class_folders(root)
    names = list(classes) if classes is not None else found
    missing = [c for c in names if c not in found]
    if missing:
        raise ConfigError("classes", list(names), f"no class folder {missing[0]}/ in {top}")
    if len(names) < 2:
        what = f"1 class folder ({names[0]})" if names else "no class folders"
        raise ConfigError(
            "path", str(root),
            f"{what}; expected one subfolder per class (2 or more): <path>/<class>/*.jpg or "
            "<path>/train/<class>/*.jpg",
        )  # fmt: skip
    if not split_layout:
        return names, {"all": _files(root, names, require=True)}
    files = {"train": _files(root / "train", names, require=True)}
    for split in ("val", "test"):
        if (root / split).is_dir():
            strange = sorted({p.name for p in (root / split).iterdir() if p.is_dir()} - set(found))
            if strange:
                raise ConfigError(
                    "path",
                    str(root),
                    f"{split}/{strange[0]}/ is not a class of train/ ({', '.join(names)})",
                )
            files[split] = _files(root / split, names, require=False)
    return names, files


def _is_image_file(path: Path, folder: Path) -> bool:
    """An image by its suffix, not hidden: macOS's `._name.jpg` (resource forks), `.DS_Store` and
    anything in a hidden folder are not images of the class."""
    hidden = any(part.startswith(".") for part in path.relative_to(folder).parts)
    return path.suffix.lower() in IMAGE_SUFFIXES and not hidden


def _files(top: Path, names: list[str], require: bool) -> Files:
    """Image files under top/<class>/ (nested folders too), each header checked."""
    Image = pillow()
    out: Files = []
    for label, name in enumerate(names):
        folder = top / name
        images = sorted(p for p in folder.rglob("*") if _is_image_file(p, folder))
        if require and not images:
            raise ConfigError(
                "path", str(top.parent if top.name in SPLITS else top),
                f"class folder {folder} holds no images (looked for {', '.join(IMAGE_SUFFIXES)})",
            )  # fmt: skip
        for file in images:
            try:  # the header only (Pillow reads lazily): cheap, and catches most broken files
                with Image.open(file):
                    pass
            except (OSError, SyntaxError, ValueError) as err:
                raise UserError(f"data.path: {file} is not a readable image ({err})") from None
            out.append((file, label))
    return out
