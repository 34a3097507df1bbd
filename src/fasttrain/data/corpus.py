"""The corpus of data=text (fasttrain.data.text): which files, read as UTF-8 documents, split
into train/val/test by a hash of each file's name; the bigram baseline a model must beat; the
folder of token memmaps written whole under a temporary name, then renamed (a killed prepare
leaves nothing half-written; two runs preparing one key at once both read one complete folder).
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import shutil
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from fasttrain.config.errors import UserError

SPLITS = ("train", "val", "test")
# Folders of the standard library that are its own tests or third-party packages.
STDLIB_SKIPPED = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


def stdlib_files() -> tuple[Path, list[Path]]:
    """(root, the standard library's .py files without its tests)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = _stdlib_listing(root)
    if not files:
        raise UserError(
            f"data.path=null: this Python's standard library sources are not installed "
            f"(no .py files under {root}); set data.path to a text file, folder or glob"
        )
    return root, list(files)


@functools.cache  # a walk of ~2,000 files (~1 s), asked for by every split, cache key and check
def _stdlib_listing(root: Path) -> tuple[Path, ...]:
    return tuple(
        p for p in sorted(root.rglob("*.py"))
        if not STDLIB_SKIPPED & set(p.relative_to(root).parts[:-1])
    )  # fmt: skip


def corpus_files(path: str | None) -> tuple[Path, list[Path]]:
    """(root the names are relative to, the corpus's files, sorted)."""
    if path is None:
        return stdlib_files()
    given = Path(path).expanduser()
    if given.is_file():
        return given.parent, [given]
    if given.is_dir():
        files = [
            p for p in sorted(given.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(given).parts)
        ]  # fmt: skip
        root = given
    else:
        files = sorted(Path(p) for p in glob.glob(str(given), recursive=True) if Path(p).is_file())
        root = Path(os.path.commonpath([str(p.parent) for p in files])) if files else given.parent
    if not files:
        what = "folder" if given.is_dir() else "file, folder or glob"
        raise UserError(f"data.path={path!r}: no files found (expected a text {what})")
    return root, files


def read_documents(root: Path, files: Sequence[Path], path: str | None) -> dict[str, bytes]:
    """name -> the file's bytes, for the files that are UTF-8 text (others skipped, said once)."""
    documents, skipped = {}, []
    for file in files:
        data = file.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(file)
            continue
        if b"\x00" in data:
            skipped.append(file)
            continue
        if data:
            documents[file.relative_to(root).as_posix()] = data
    if not documents:
        raise UserError(
            f"data.path={path!r}: the corpus has no text: {len(files)} files, none of them "
            f"non-empty UTF-8 text ({len(skipped)} with undecodable or NUL bytes)"
        )
    if skipped:
        rank_zero_warn(
            f"data.path: skipped {len(skipped)} of {len(files)} files that are not UTF-8 text "
            f"(undecodable bytes or NUL bytes), e.g. {skipped[0]}"
        )
    return documents


def split_documents(
    documents: dict[str, bytes], val_fraction: float, test_fraction: float, seed: int
) -> dict[str, list[bytes]]:
    """train/val/test lists of documents (see the module doc)."""
    if len(documents) == 1:
        (data,) = documents.values()
        cuts = []
        for share in (1 - val_fraction - test_fraction, 1 - test_fraction):
            at = int(len(data) * share)
            # Back to a character's first byte (not a continuation byte, 0b10xxxxxx): each split
            # stays UTF-8 text (a BPE decodes it), and every byte of the file is counted once.
            while 0 < at < len(data) and data[at] & 0xC0 == 0x80:
                at -= 1
            cuts.append(at)
        val_at, test_at = cuts
        return {"train": [data[:val_at]], "val": [data[val_at:test_at]], "test": [data[test_at:]]}
    splits: dict[str, list[bytes]] = {s: [] for s in SPLITS}
    for name in sorted(documents):
        digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
        share = int.from_bytes(digest[:8], "big") / 2**64
        split = (
            "test"
            if share < test_fraction
            else "val"
            if share < test_fraction + val_fraction
            else "train"
        )
        splits[split].append(documents[name])
    return splits


def bigram_bits_per_byte(train: bytes, test: bytes) -> float:
    """The bigram baseline a language model must beat: bits per byte of `test` under
    P(byte | previous byte) counted on `train` (add-one smoothed), its conditional entropy."""
    counts = np.ones((256, 256), dtype=np.float64)  # add-one: no byte pair has probability 0
    a = np.frombuffer(train, dtype=np.uint8)
    np.add.at(counts, (a[:-1], a[1:]), 1)
    log_p = np.log2(counts / counts.sum(axis=1, keepdims=True))
    b = np.frombuffer(test, dtype=np.uint8)
    return float(-log_p[b[:-1], b[1:]].mean())


def write_folder(folder: Path, encoded: dict[str, np.ndarray], dtype: np.dtype,
                  meta: dict[str, Any], tokenizer_json: str) -> None:  # fmt: skip
    """Write the memmaps, meta.json and tokenizer.json under a temporary name, then rename the
    folder whole (see the module doc)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(folder)
    tmp = folder.with_name(f".{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        for split, ids in encoded.items():
            ids.astype(dtype).tofile(tmp / f"{split}.bin")
        (tmp / "tokenizer.json").write_text(tokenizer_json)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))  # last: marks it complete
        try:
            os.rename(tmp, folder)
        except OSError:  # another process renamed its copy first: keep that one
            if not (folder / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rank_zero_info(
        f"token memmaps: {folder} ("
        + ", ".join(f"{s} {v['tokens']:,} tokens" for s, v in meta["splits"].items())
        + ")"
    )


def _remove_stale(folder: Path) -> None:
    """Temporary folders of this key left by a writer that was killed (its process is gone)."""
    for tmp in folder.parent.glob(f".{folder.name}.*.tmp"):
        pid = tmp.name.rsplit(".", 2)[-2]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
