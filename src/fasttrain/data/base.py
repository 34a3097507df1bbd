"""Shared loader logic: in-memory (x, y) splits served a batch at a time (fasttrain.data.batches),
from host memory or from the accelerator's."""

from __future__ import annotations

import atexit
import functools
import multiprocessing
import os
import signal
from collections.abc import Callable
from typing import Annotated, Any, Literal

import lightning as L
import torch
from lightning.fabric.utilities.seed import pl_worker_init_function
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, TensorDataset

from fasttrain.config.domains import AtLeast, Range, check_arguments
from fasttrain.config.errors import ConfigError
from fasttrain.config.settings import Seed
from fasttrain.data.batches import Batched, as_batch, device_loader
from fasttrain.data.checks import Sizes
from fasttrain.data.resumable import ResumableLoader, first_epoch

Auto = Literal["auto"]
# Knobs that tune loading speed on this machine but never change which samples a split holds.
LOADER_ARGS = (
    "batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor",
    "device_prefetch", "on_device",
)  # fmt: skip


def is_location(key: str) -> bool:
    """Whether a data argument says where files are read or written (path, cache_dir,
    tokenizer_file, x_path, download, ...). These come from the command line and the user's
    conf/, never from a checkpoint: a checkpoint from elsewhere (or a crafted one) would read
    and write wherever it says (fasttrain.assemble.restore)."""
    return key in ("path", "root", "download") or key.endswith(("_path", "_dir", "_file", "_root"))


# A data module's record of what each split holds ({split: {"files", "sha256"}}), kept with its
# hyperparameters in checkpoints (fasttrain.data.image_folder writes it).
SPLIT_RECORD = "split_record"


def split_change(saved: Any, now: Any) -> str | None:
    """How the files of each split differ from a checkpoint's record, in words (None: the same,
    or nothing recorded)."""
    if not isinstance(saved, dict) or not isinstance(now, dict) or saved == now:
        return None
    changed = [
        f"{split} {_files(saved, split)} -> {_files(now, split)} files"
        for split in sorted(set(map(str, saved)) | set(map(str, now)))
        if saved.get(split) != now.get(split)
    ]
    return f"the data files changed since the checkpoint ({', '.join(changed)})"


def _files(record: dict[str, Any], split: str) -> str:
    """A split's file count in a record (a checkpoint's is input: any shape may come)."""
    entry = record.get(split)
    count = entry.get("files") if isinstance(entry, dict) else None
    return str(count) if isinstance(count, int) else "?"


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))  # respects taskset/cgroup limits, unlike cpu_count()
    except AttributeError:
        return os.cpu_count() or 1


def resolve_num_workers(num_workers: int | Auto) -> int:
    """Under "auto": one worker per CPU, leaving one for the training process, at most 8.

    Beyond ~8 workers, per-batch IPC dominates for small samples; keep the main process free
    because it runs the optimizer step and (on GPU) launches kernels.
    """
    if num_workers == "auto":
        return max(0, min(8, cpu_count() - 1))
    return num_workers


def max_workers() -> int:
    """The most loader workers a data set takes: each is a process, so a slip of the keyboard
    (num_workers=100000) forked until the machine gave out instead of failing in one line. Well
    above any useful count: more than a few per CPU only wait on each other."""
    return max(64, 4 * cpu_count())


# The domains of the arguments the data sets share, each declared once (fasttrain.config.domains):
# every battery's signature uses these, so the config check and the Python constructor say the
# same. Seed is the run's own (fasttrain.config.settings); an input shape is config.domains.Shape.
BatchSize = Annotated[int, AtLeast(1)]
# the bound is this machine's, as fasttrain.data.base is imported
Workers = Annotated[int, Range(0, max_workers(), note="4 per CPU, at least 64")]
PrefetchFactor = Annotated[int | None, AtLeast(1)]
Fraction = Annotated[float, Range(0, 1, low_open=True, high_open=True, what="a fraction")]
Classes = Annotated[int, AtLeast(2)]
NumFolds = Annotated[int, AtLeast(2)]
Fold = Annotated[int | None, AtLeast(0, note="below data.num_folds", null="off")]


def check_folds(num_folds: int, fold: int | None) -> None:
    """`fold` one of the `num_folds` (each declared on its own: NumFolds, Fold), checked when
    the module is built, before a run writes anything. The size checks need the rows: the data
    module's (fasttrain.data.checks, with fasttrain.data.folds.fold_sizes) and fold_indices'."""
    if fold is not None and fold >= num_folds:
        raise ConfigError(
            "fold", fold, f"expected 0..{num_folds - 1} (data.num_folds={num_folds}) or null"
        )


def resolve_pin_memory(pin_memory: bool | Auto) -> bool:
    """Pin host memory under "auto" when a CUDA device will receive the batches (async copies)."""
    if pin_memory == "auto":
        return torch.cuda.is_available()
    return pin_memory


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    """The held-out shares of a split together below 1 (each is a Fraction, declared)."""
    if val_fraction + test_fraction >= 1.0:
        raise ConfigError("val_fraction", val_fraction, "val_fraction + test_fraction must be < 1")


def floor_sizes(val_fraction: float, test_fraction: float) -> Sizes:
    """rows -> (train, val, test) rows of a split that holds out at least one row each, rounding
    down (fasttrain.data.npy and .synthetic cut their shuffled rows so)."""

    def sizes(rows: int) -> tuple[int, int, int]:
        val, test = max(1, int(rows * val_fraction)), max(1, int(rows * test_fraction))
        return rows - val - test, val, test

    return sizes


def worker_init(rank: int) -> Callable[[int], None]:
    """Each loader worker's start: leave SIGTERM and Ctrl-C to the training process.

    Both reach every process of the group (`timeout`, SLURM, a terminal); a worker that died of
    them made the main process fail with "DataLoader worker ... killed by signal" instead of
    saving last.ckpt after the current batch (fasttrain.fit). Lightning seeds workers through
    `worker_init_fn` only where none is set, so that seeding is kept here.
    """
    seed = bool(int(os.environ.get("PL_SEED_WORKERS", 0)))  # as Lightning decides it
    _kill_workers_at_exit()
    return functools.partial(_start_worker, rank=rank, seed=seed)


@functools.cache  # registered once per process
def _kill_workers_at_exit() -> None:
    """At interpreter exit multiprocessing stops daemonic children with SIGTERM, then joins
    them: a worker ignoring SIGTERM (above) whose loader was still iterating (an error
    mid-epoch, an iterator left open) made the exit wait forever. atexit runs this first
    (registered after multiprocessing's own hook): such workers are killed outright."""
    atexit.register(_kill_daemonic_children)


def _kill_daemonic_children() -> None:
    # torch's SIGCHLD handler would report each killed worker as a failure of the loader.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()


def _start_worker(worker_id: int, rank: int, seed: bool) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if seed:
        pl_worker_init_function(worker_id, rank=rank)


class TensorDataModule(L.LightningDataModule):
    """Base for data sets that fit in memory: subclasses build the three splits, this serves them.

    Every split is served a batch at a time: one gather per batch (fasttrain.data.batches).

    Args:
        batch_size: samples per step on each device.
        num_workers: loader worker processes, or "auto": 0 here, since a batch is one gather
            in memory and workers pay off only for decoding work (their start-up and the
            per-batch inter-process copy would cost more than the gather).
        pin_memory: page-locked host batches for async host-to-GPU copies, or "auto" (on CUDA).
        persistent_workers: keep workers alive between epochs (saves their start-up each epoch).
        prefetch_factor: batches each worker prepares ahead; ignored without workers.
        val_fraction, test_fraction: shares of the data held out, each in (0, 1).
        seed: fixes the split (and the synthetic data) independently of the global seed.
        device_prefetch: copy the next batch to the GPU on a side CUDA stream during the current
            step (fasttrain.data.prefetch); on CPU a no-op that says so once.
        on_device: copy the splits to the accelerator once and gather every batch there (no
            copy per step, no pinning; fasttrain.data.batches). Needs num_workers 0.
    """

    def __init__(
        self,
        batch_size: BatchSize = 64,
        num_workers: Workers | Auto = "auto",
        pin_memory: bool | Auto = "auto",
        persistent_workers: bool = True,
        prefetch_factor: PrefetchFactor = 2,
        val_fraction: Fraction = 0.15,
        test_fraction: Fraction = 0.2,
        seed: Seed = 42,
        device_prefetch: bool = False,
        on_device: bool = False,
    ) -> None:
        super().__init__()
        check_arguments(TensorDataModule.__init__, locals())
        if on_device and num_workers not in ("auto", 0):
            raise ConfigError(
                "on_device", on_device,
                f"batches are gathered on the device, in the training process: set "
                f"data.num_workers=0 (or auto), not {num_workers}",
            )  # fmt: skip
        check_fractions(val_fraction, test_fraction)
        self.batch_size = batch_size
        self.num_workers = 0 if num_workers == "auto" else num_workers
        self.on_device = on_device
        self.pin_memory = resolve_pin_memory(pin_memory) and not on_device
        self.persistent_workers = persistent_workers
        self.prefetch_factor = prefetch_factor
        self.val_fraction, self.test_fraction, self.seed = val_fraction, test_fraction, seed
        self.splits: dict[str, TensorDataset] = {}
        self._device_splits: dict[str, Batched] = {}
        self.device_prefetch = device_prefetch
        self._said_no_prefetch = False

    # The fewest rows each held-out split may get: one sample scores a class label; a
    # regression's R^2 needs two (fasttrain.data.regression).
    held_out_rows = 1

    def make_splits(self) -> dict[str, TensorDataset]:
        """{"train", "val", "test"} -> (x: float32 [N, *input_shape], y: int64 [N]) datasets.
        Checks what only the loaded arrays tell (fasttrain.data.checks): enough rows for the
        splits, no NaN or inf."""
        raise NotImplementedError

    def source(self) -> str:
        """Where the data came from, as its errors name it: the override of a file (npy's
        data.path=...), else the data set."""
        return type(self).__name__

    def setup(self, stage: str | None = None) -> None:
        if not self.splits:  # every stage shares one split; build it once per process
            self.splits = {k: Batched(*v.tensors) for k, v in self.make_splits().items()}

    def prepare_before_trainer(self) -> None:
        """Load, check and split the data before the trainer and its loggers exist
        (fasttrain.assemble.build_run): too few rows or a NaN is then one line before the run
        (logger, checkpoints) writes anything. Lightning's later setup() finds them built."""
        self.setup()

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        if self.on_device:
            return self._device_loader(split, shuffle)
        workers = self.num_workers
        # Shuffled = training: an order fixed by (seed, epoch) that resumes mid-epoch exactly.
        order: dict[str, Any] = {"seed": self.seed, "epoch": first_epoch(self.trainer)}
        loader: type[DataLoader[Any]]
        loader, order = (ResumableLoader, order) if shuffle else (DataLoader, {})
        device = self._prefetch_device()
        if device is not None:  # a CUDA device's stream prefetch: loaded only there
            from fasttrain.data.prefetch import PREFETCHING

            loader, order = PREFETCHING[loader], {**order, "prefetch_to": device}
        return loader(
            self.splits[split],
            **order,
            batch_size=self.batch_size,
            collate_fn=as_batch,
            num_workers=workers,
            worker_init_fn=worker_init(self.trainer.global_rank if self.trainer else 0),
            pin_memory=self.pin_memory,
            # Both only exist with worker processes; DataLoader rejects them otherwise.
            persistent_workers=self.persistent_workers and workers > 0,
            prefetch_factor=self.prefetch_factor if workers > 0 else None,
        )

    def _device_loader(self, split: str, shuffle: bool) -> DataLoader:
        """data.on_device: the split moves to the accelerator on first use; same sampler and
        batch sampler as the host path, so the same batches in the same order."""
        return device_loader(
            self.splits, self._device_splits, split, shuffle, self.trainer, self.seed,
            self.batch_size,
        )  # fmt: skip

    def _prefetch_device(self) -> torch.device | None:
        """The CUDA device batches are prefetched to, or None (off, or nothing to prefetch to)."""
        if not self.device_prefetch:
            return None
        device = self.trainer.strategy.root_device if self.trainer is not None else None
        if device is not None and device.type == "cuda":
            return device
        if not self._said_no_prefetch:
            self._said_no_prefetch = True
            rank_zero_info(
                f"data.device_prefetch=true: the device is {device or 'not set'}, not CUDA; "
                "batches are loaded as usual (prefetching to a GPU is a no-op here)"
            )
        return None

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)
