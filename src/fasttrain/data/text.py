"""data=text: any text corpus as token memmaps, served as random windows (nanoGPT's layout).

- The corpus: `path` a file, a folder (every file in it, recursively, hidden ones skipped) or a
  glob; null: the `.py` sources of the running Python's standard library (its tests left out),
  which every Python installation has: no download, no data of ours.
- Documents are files. Each goes to train, val or test by a hash of its name and `seed`, so a
  file added later does not move the others. One file alone is split by position instead: its
  last `val_fraction + test_fraction` is val, then test (as nanoGPT splits one file).
- A file that is not UTF-8 text (bytes that do not decode, or NUL bytes: a binary) is skipped
  and counted in one line, for both tokenizers, so bits per byte compare across them.
- Token ids of each split are written once to `<cache_dir>/<key>/{train,val,test}.bin`
  (uint16, or uint32 for vocabularies over 65536), keyed by the corpus files (names, sizes,
  times), the split and the tokenizer. The folder is written under a temporary name and renamed
  whole: a killed prepare leaves nothing half-written, and two runs preparing the same key at
  once both end up reading one complete folder. `python -m fasttrain.prepare data=text` writes
  it ahead of time.
- Training batches are random windows of `block_size + 1` tokens (inputs and next-token
  targets), gathered a batch at a time from the memmap: one fancy index, no per-sample Python.
  A window's start is a hash of (seed, epoch, its index in the epoch), so a resumed run gets
  the very windows it would have had (fasttrain.data.resumable). An "epoch" is
  `windows_per_epoch` windows, so validation and checkpoints come at regular steps.
- Validation and test windows are `eval_windows` fixed windows spread evenly over the split.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import lightning as L
import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from fasttrain.config.domains import AtLeast, Shape, check_arguments
from fasttrain.config.errors import ConfigError, UserError
from fasttrain.data.base import (
    BatchSize,
    Fraction,
    Seed,
    Workers,
    check_fractions,
    resolve_pin_memory,
)
from fasttrain.data.batches import as_batch
from fasttrain.data.corpus import (
    SPLITS,
    corpus_files,
    read_documents,
    split_documents,
    write_folder,
)
from fasttrain.data.resumable import ResumableLoader, first_epoch
from fasttrain.data.tokenizer import (
    BYTE_VOCAB,
    BpeTokenizer,
    ByteTokenizer,
    Tokenizer,
    fingerprint,
    from_json,
)

CACHE_VERSION = 1
UINT16_VOCAB = 1 << 16
TokenDtype = Literal["auto", "uint16", "uint32"]
Count = Annotated[int, AtLeast(1)]  # of tokens or windows
# 256 for the byte tokenizer, more for a BPE: which one is checked with data.tokenizer
VocabSize = Annotated[int, AtLeast(BYTE_VOCAB, note="the 256 byte symbols, plus a BPE's merges")]


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on uint64 values (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class TokenWindows:
    """Windows of `block_size + 1` tokens of one split. Random (training): `__getitems__` takes
    epoch-tagged indices (epoch x len + i: `positioned`, fasttrain.data.resumable.EpochTagged)
    and starts each window at a hash of (seed, tag). Fixed (`starts` given): window i starts at
    starts[i]. Tokens on the host (a memmap) or on the accelerator (data.on_device)."""

    positioned = True

    def __init__(self, tokens: Any, block_size: int, length: int, seed: int,
                 starts: np.ndarray | None = None) -> None:  # fmt: skip
        self.tokens, self.block_size, self.length, self.seed = tokens, block_size, length, seed
        self.starts = starts
        self.positioned = starts is None
        self.span = len(tokens) - block_size  # possible starts: 0..span-1
        self.offsets = np.arange(block_size + 1)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.__getitems__([index])
        return x[0], y[0]

    def window_starts(self, indices: Sequence[int]) -> np.ndarray:
        if self.starts is not None:
            return self.starts[np.asarray(indices)]
        with np.errstate(over="ignore"):
            tags = np.asarray(indices, dtype=np.uint64)
            return (_mix(_mix(np.full_like(tags, self.seed)) ^ tags) % np.uint64(self.span)).astype(
                np.int64
            )

    def __getitems__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self.window_starts(indices)
        if isinstance(self.tokens, torch.Tensor):  # on the device: the starts cross, not tokens
            index = torch.from_numpy(starts[:, None] + self.offsets)
            if self.tokens.device.type == "cuda":  # pinned: an async copy, no host sync
                index = index.pin_memory()
            windows = self.tokens[index.to(self.tokens.device, non_blocking=True)].long()
        else:
            windows = torch.from_numpy(self.tokens[starts[:, None] + self.offsets].astype(np.int64))
        return windows[:, :-1], windows[:, 1:]


class TextDataModule(L.LightningDataModule):
    """Token windows of a text corpus (see the module doc).

    Args:
        path: a text file, a folder or a glob; null: the standard library's .py sources.
        tokenizer: "byte" (256 symbols) or "bpe" (trained on the training split).
        vocab_size: the tokenizer's vocabulary (256 for byte; the BPE's size for bpe).
        tokenizer_file: a BPE tokenizer.json to use instead of training one (a run folder has
            one): its vocabulary must be `vocab_size`.
        block_size: tokens of context per window (the model's block_size follows it).
        batch_size: windows per step on each device.
        windows_per_epoch: training windows that make an epoch.
        eval_windows: validation and test windows (fewer when a split is shorter).
        val_fraction, test_fraction, seed: the split by document (see the module doc); seed
            also draws the training windows.
        cache_dir: where the token memmaps go (a folder per corpus, split and tokenizer).
        token_dtype: the memmaps' integer type: auto (uint16 up to 65536 symbols, else uint32).
        num_workers: loader worker processes (a batch is one memmap gather: 0 is fastest).
        pin_memory: page-locked batches for async host-to-GPU copies, or "auto" (on CUDA).
        on_device: copy each split's tokens to the accelerator once; windows are gathered there.
    """

    def __init__(
        self,
        path: str | None = None,
        tokenizer: Literal["byte", "bpe"] = "byte",
        vocab_size: VocabSize = BYTE_VOCAB,
        tokenizer_file: str | None = None,
        block_size: Count = 256,
        batch_size: BatchSize = 32,
        windows_per_epoch: Count = 4096,
        eval_windows: Count = 256,
        val_fraction: Fraction = 0.05,
        test_fraction: Fraction = 0.05,
        seed: Seed = 42,
        cache_dir: str = "data/text",
        token_dtype: TokenDtype = "auto",
        num_workers: Workers = 0,
        pin_memory: bool | Literal["auto"] = "auto",
        on_device: bool = False,
        input_shape: Shape | None = None,
    ) -> None:
        super().__init__()
        check_arguments(TextDataModule.__init__, locals())
        _check_args(tokenizer, vocab_size, token_dtype, num_workers, on_device)
        check_fractions(val_fraction, test_fraction)
        self.save_hyperparameters()
        self.path, self.tokenizer_kind, self.vocab_size = path, tokenizer, vocab_size
        self.tokenizer_file, self.block_size, self.batch_size = (
            tokenizer_file,
            block_size,
            batch_size,
        )
        self.windows_per_epoch, self.eval_windows = windows_per_epoch, eval_windows
        self.val_fraction, self.test_fraction, self.seed = val_fraction, test_fraction, seed
        self.cache_dir, self.token_dtype = Path(cache_dir), token_dtype
        self.num_workers, self.on_device = num_workers, on_device
        self.pin_memory = resolve_pin_memory(pin_memory) and not on_device
        self.input_shape = (block_size,)
        self.tokenizer: Tokenizer | None = None
        self.tokenizer_json: str | None = None  # given by a checkpoint (use_tokenizer)
        self.tokens: dict[str, Any] = {}
        self.meta: dict[str, Any] = {}
        self.folder: Path | None = None
        self.dtype()  # a vocabulary the memmap type cannot hold: refused before anything runs
        if path is not None:  # a corpus that is not there: refused before a run folder exists
            corpus_files(path)

    # ---- the token files ------------------------------------------------------------------
    def use_tokenizer(self, tokenizer_json: str) -> None:
        """Encode with the tokenizer a checkpoint recorded (evaluate, predict, export)."""
        self.tokenizer_json = tokenizer_json

    def dtype(self) -> np.dtype:
        if self.token_dtype == "uint32" or (
            self.token_dtype == "auto" and self.vocab_size > UINT16_VOCAB
        ):
            return np.dtype(np.uint32)
        if self.vocab_size > UINT16_VOCAB:
            raise UserError(
                f"data.token_dtype=uint16: the vocabulary of {self.vocab_size} tokens does not "
                f"fit (uint16 holds ids 0..65535); use data.token_dtype=uint32 or auto"
            )
        return np.dtype(np.uint16)

    def _given_tokenizer(self) -> str | None:
        """The tokenizer JSON to use as it is (a checkpoint's or data.tokenizer_file), or None."""
        if self.tokenizer_json is not None:
            return self.tokenizer_json
        if self.tokenizer_file is None:
            return None
        file = Path(self.tokenizer_file).expanduser()
        if not file.is_file():
            raise UserError(f"data.tokenizer_file={self.tokenizer_file!r}: no such file")
        return file.read_text(errors="replace")

    def cache_key(self, root: Path, files: Sequence[Path], given: str | None) -> str:
        listing = [(f.relative_to(root).as_posix(), f.stat().st_size, f.stat().st_mtime_ns)
                   for f in files]  # fmt: skip
        spec = {
            "version": CACHE_VERSION, "root": str(root.resolve()), "files": listing,
            "split": [self.val_fraction, self.test_fraction, self.seed],
            "tokenizer": [self.tokenizer_kind, self.vocab_size,
                          fingerprint(given) if given else None],
            "dtype": self.dtype().name,
        }  # fmt: skip
        return hashlib.sha256(json.dumps(spec).encode()).hexdigest()[:20]

    def prepare_data(self) -> None:
        self.token_folder()

    def prepare_before_trainer(self) -> None:
        """Read and check the corpus, and write its memmaps, before a trainer exists
        (fasttrain.assemble.build_run): an empty corpus or a block_size longer than a split is
        one line then. Later calls find the folder."""
        self.token_folder()

    def token_folder(self) -> Path:
        """The folder of this corpus's token memmaps, written first if absent."""
        dtype = self.dtype()  # a dtype that cannot hold the vocabulary: refused before reading
        root, files = corpus_files(self.path)
        given = self._given_tokenizer()
        folder = self.cache_dir / self.cache_key(root, files, given)
        if (folder / "meta.json").is_file():
            return folder
        # The folder the training run wrote when it made this very tokenizer (a checkpoint's,
        # or another run's file): its tokens are the same.
        trained = self.cache_dir / self.cache_key(root, files, None)
        made = trained / "tokenizer.json"
        if given is not None and (trained / "meta.json").is_file() and made.read_text() == given:
            return trained
        documents = read_documents(root, files, self.path)
        splits = split_documents(documents, self.val_fraction, self.test_fraction, self.seed)
        for split, docs in splits.items():
            if not docs or not any(docs):
                raise UserError(
                    f"data.{split}_fraction: the {split} split got none of the corpus's "
                    f"{len(documents)} documents; use more files or a larger fraction"
                )
        tokenizer = self._tokenizer(given, splits["train"])
        encoded = {s: np.concatenate(tokenizer.encode(docs)) for s, docs in splits.items()}
        self._check_lengths({s: len(ids) for s, ids in encoded.items()})
        meta = {
            "corpus": str(root) if self.path is None else self.path, "documents": len(documents),
            "tokenizer": tokenizer.kind, "vocab_size": tokenizer.vocab_size, "dtype": dtype.name,
            "tokenizer_fingerprint": fingerprint(tokenizer.to_json()),
            "splits": {s: {"documents": len(splits[s]), "tokens": len(encoded[s]),
                           "bytes": sum(map(len, splits[s]))} for s in SPLITS},
        }  # fmt: skip
        write_folder(folder, encoded, dtype, meta, tokenizer.to_json())
        return folder

    def _tokenizer(self, given: str | None, train_docs: Sequence[bytes]) -> Tokenizer:
        if given is not None:
            where = (f"data.tokenizer_file={self.tokenizer_file!r}"
                     if self.tokenizer_json is None else "the checkpoint's tokenizer")  # fmt: skip
            tokenizer = from_json(given, where)
        elif self.tokenizer_kind == "byte":
            tokenizer = ByteTokenizer()
        else:
            rank_zero_info(
                f"training a byte-level BPE of {self.vocab_size} tokens on the training split"
            )
            tokenizer = BpeTokenizer.train(train_docs, self.vocab_size)
        if tokenizer.vocab_size != self.vocab_size:
            raise UserError(
                f"data.vocab_size={self.vocab_size}: the tokenizer has {tokenizer.vocab_size} "
                f"tokens ({tokenizer.kind}); set data.vocab_size={tokenizer.vocab_size}"
            )
        return tokenizer

    def _check_lengths(self, tokens: dict[str, int]) -> None:
        for split, n in tokens.items():
            if n < self.block_size + 2:
                raise UserError(
                    f"data.block_size={self.block_size}: the {split} split has {n} tokens; a "
                    f"window needs block_size + 1 (use a smaller block_size or more text)"
                )

    def setup(self, stage: str | None = None) -> None:
        if self.tokens:
            return
        folder = self.token_folder()
        self.folder = folder
        self.meta = json.loads((folder / "meta.json").read_text())
        self.tokenizer = from_json((folder / "tokenizer.json").read_text(), str(folder))
        self._check_lengths({s: v["tokens"] for s, v in self.meta["splits"].items()})
        dtype = np.dtype(self.meta["dtype"])
        for split in SPLITS:
            self.tokens[split] = np.memmap(folder / f"{split}.bin", dtype=dtype, mode="r")

    # ---- what the task reads ---------------------------------------------------------------
    def bytes_per_token(self, split: str) -> float:
        """The split's UTF-8 bytes over its tokens (1 for the byte tokenizer): bits per byte =
        nats per token / ln 2 / this."""
        self.setup()
        entry = self.meta["splits"][split]
        return entry["bytes"] / max(1, entry["tokens"])

    def tokenizer_record(self) -> str:
        self.setup()
        assert self.tokenizer is not None
        return self.tokenizer.to_json()

    # ---- loaders ----------------------------------------------------------------------------
    def _split_tokens(self, split: str) -> Any:
        self.setup()
        tokens = self.tokens[split]
        if not self.on_device:
            return tokens
        device = (
            self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")
        )
        if not isinstance(tokens, torch.Tensor) or tokens.device != device:
            tokens = torch.from_numpy(np.asarray(tokens).astype(np.int32)).to(device)
            self.tokens[split] = tokens
        return tokens

    def train_dataloader(self) -> DataLoader:
        tokens = self._split_tokens("train")
        windows = TokenWindows(tokens, self.block_size, self.windows_per_epoch, self.seed)
        return ResumableLoader(
            windows, seed=self.seed, epoch=first_epoch(self.trainer), batch_size=self.batch_size,
            collate_fn=as_batch, num_workers=self.num_workers, pin_memory=self.pin_memory,
            persistent_workers=self.num_workers > 0,
        )  # fmt: skip

    def _fixed_loader(self, split: str) -> DataLoader:
        tokens = self._split_tokens(split)
        count = max(1, min(self.eval_windows, (len(tokens) - 1) // self.block_size))
        starts = np.linspace(0, len(tokens) - self.block_size - 1, count).astype(np.int64)
        windows = TokenWindows(tokens, self.block_size, count, self.seed, starts=starts)
        return DataLoader(windows, batch_size=self.batch_size, collate_fn=as_batch,  # type: ignore[arg-type]
                          num_workers=self.num_workers, pin_memory=self.pin_memory)  # fmt: skip

    def val_dataloader(self) -> DataLoader:
        return self._fixed_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._fixed_loader("test")


def _check_args(tokenizer: str, vocab_size: int, token_dtype: str, num_workers: int,
                on_device: bool) -> None:  # fmt: skip
    """What the declared rules cannot say: the vocabulary each tokenizer has, and on_device
    without loader workers."""
    if tokenizer == "byte" and vocab_size != BYTE_VOCAB:
        raise ConfigError("vocab_size", vocab_size,
                          "the byte tokenizer has 256 symbols; for another size train a BPE: "
                          "data.tokenizer=bpe")  # fmt: skip
    if tokenizer == "bpe" and vocab_size == BYTE_VOCAB:
        raise ConfigError("vocab_size", vocab_size,
                          "a byte-level BPE has the 256 byte symbols plus its merges: expected "
                          "an int > 256 (e.g. 4096)")  # fmt: skip
    if on_device and num_workers:
        raise ConfigError(
            "on_device", on_device, "windows are gathered on the device: set data.num_workers=0"
        )
