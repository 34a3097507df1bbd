"""A training DataLoader that a run killed mid-epoch resumes exactly where it stopped.

The shuffle order is a function of (seed, epoch) alone, not of the global RNG, and the loader
implements Lightning's `state_dict`/`load_state_dict` protocol: Lightning stores how many batches
of the current epoch were served in each checkpoint and, on a mid-epoch restart, hands it back
before iterating, so the resumed epoch serves exactly the batches the interrupted one had left.
A plain shuffling DataLoader restarts the epoch from a fresh random order instead.

The position is a number of batches, so it holds only for the batch size it was counted in:
resuming mid-epoch with another `data.batch_size` is refused (Lightning's own loop counts the
epoch's batches in the old size too, and would end the epoch early or at once).

Not torchdata's StatefulDataLoader, the library's loader for the job: per batch it makes 295
Python calls to this loader's 39 and takes 94.5 us to 72.5 us without workers
(`bench/stateful_loader.py`, 2-vCPU VM, BENCHMARKS.md), on the hot path of every step.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler

from fasttrain.config.errors import UserError

_MASK64 = (1 << 64) - 1


def position_seed(*position: int) -> int:
    """A 32-bit seed that depends on every value of `position` (seed, epoch, batch, rank): each
    value is folded in with SplitMix64's finalizer, so neighbouring positions get unrelated
    seeds. Pure integer arithmetic, the same on every Python (~2 us, where numpy's
    SeedSequence takes ~15 us: this runs before every training batch)."""
    h = 0
    for value in position:
        h = ((h ^ (value & _MASK64)) + 0x9E3779B97F4A7C15) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h >> 32


class EpochShuffle(RandomSampler):
    """A permutation of the dataset drawn from `seed + epoch` (DistributedSampler's convention).

    Subclasses RandomSampler so Lightning still sees a shuffling loader (it then shuffles the
    DistributedSampler it substitutes under DDP, which follows the same convention).
    """

    def __init__(self, data_source: Sized, seed: int, epoch: int = 0) -> None:
        super().__init__(data_source)
        self.seed, self.epoch = seed, epoch

    def set_epoch(self, epoch: int) -> None:  # called by Lightning before each epoch
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(len(self.data_source), generator=gen).tolist())


def first_epoch(trainer: Any) -> int:
    """The epoch a new training loader starts in: 0, or the one a resumed run continues with.

    Lightning calls the sampler's set_epoch only after it has created the first iterator, and
    worker processes draw their first indices at creation: the sampler must know the epoch
    before (with workers, a run resumed at an epoch end would replay epoch 0's order).
    `processed` counts the epochs whose batches all ran, which is the next one's index.
    """
    if trainer is None:
        return 0
    return int(trainer.fit_loop.epoch_progress.current.processed)


class EpochTagged(RandomSampler):
    """`sampler`'s indices tagged with the epoch: epoch x N + index, for a dataset whose samples
    draw random augmentation from their position (`positioned`, fasttrain.data.images.Images):
    a sample's crop and flip are then a function of (seed, epoch, index), the same in a run
    resumed mid-epoch as in one that never stopped, with or without loader workers (whose RNG
    streams a resume does not restore). Forwards `set_epoch` (Lightning's DistributedSampler
    under DDP is wrapped the same way)."""

    def __init__(self, sampler: Any, data_source: Sized) -> None:
        super().__init__(data_source)
        self.sampler, self.n = sampler, len(data_source)

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return int(getattr(self.sampler, "epoch", 0))

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self) -> Iterator[int]:
        tag = self.epoch * self.n
        return (tag + int(i) for i in self.sampler)


class _SkipFirst:
    """Batches of `batches` after the first `skip`; the length stays the full epoch's."""

    def __init__(self, batches: Any, skip: int) -> None:
        self.batches, self.skip = batches, skip

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.batches), self.skip, None)


class ResumableLoader(DataLoader):
    """DataLoader shuffled by `EpochShuffle(seed)` that resumes mid-epoch (see module doc).

    Skipping works on batch indices, so skipped batches are never loaded.
    """

    def __init__(self, dataset: Any, seed: int, epoch: int = 0, **kwargs: Any) -> None:
        # Lightning re-creates the loader with its own sampler under DDP: keep that one then.
        if kwargs.get("sampler") is None and kwargs.get("batch_sampler") is None:
            kwargs["sampler"] = EpochShuffle(dataset, seed, epoch)
        sampler = kwargs.get("sampler")
        if (
            getattr(dataset, "positioned", False)
            and sampler is not None
            and not isinstance(sampler, EpochTagged)
        ):
            kwargs["sampler"] = EpochTagged(sampler, dataset)
        kwargs.pop("shuffle", None)
        self._served = 0  # batches of the current epoch handed out so far
        self._skip = 0  # batches to skip on the next pass (set by load_state_dict)
        self._skipper: _SkipFirst | None = None
        super().__init__(dataset, **kwargs)
        self.seed, self.epoch = seed, epoch

    @property
    def _index_sampler(self) -> Iterable[Any]:
        # DataLoader's iterators draw their batches of indices from this property. Private: torch
        # has no public hook to skip served batches without re-reading them;
        # tests/test_architecture.py fails if the property goes.
        sampler = super()._index_sampler
        if not self._skip:
            return sampler
        self._skipper = _SkipFirst(sampler, self._skip)
        return self._skipper

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a counting generator
        iterator = self._batches()  # the skip applies to this pass
        self._served, self._skip = self._skip, 0
        if self._skipper is not None:
            # A persistent-worker iterator keeps the wrapper and re-reads it every epoch.
            self._skipper.skip, self._skipper = 0, None
        return self._count(iterator)

    def _batches(self) -> Iterable[Any]:
        """This pass's batches, the first `self._skip` left out (DataLoader's iterator reads
        `_index_sampler`, which applies the skip)."""
        return super().__iter__()

    def _count(self, iterator: Iterable[Any]) -> Iterator[Any]:
        for batch in iterator:
            self._served += 1
            yield batch

    def unserve(self, batches: int) -> None:
        """Count the last `batches` served as not served: fetched, but their step failed
        (fasttrain.checkpoints.crash), so a resume serves them again."""
        self._served = max(0, self._served - batches)

    def state_dict(self) -> dict[str, int]:
        epoch = int(getattr(self.sampler, "epoch", 0))
        return {"epoch": epoch, "batches": self._served, "batch_size": self.batch_size or 0}

    def load_state_dict(self, state: dict[str, int]) -> None:
        # Checkpoints of older versions hold no batch size: taken as this one.
        saved = state.get("batch_size") or self.batch_size
        if state["batches"] and saved != self.batch_size:
            raise UserError(
                f"data.batch_size={self.batch_size}: the checkpoint stopped mid-epoch after "
                f"{state['batches']} batches of {saved}, a position that holds for that batch "
                f"size only; resume with data.batch_size={saved} (it may change at an epoch "
                "end), or start over with resume=never"
            )
        # A save at the epoch's last batch (before its end: validation, say) holds the whole epoch
        # as served; Lightning then goes on with the next epoch, which must start in full.
        epoch, skip = state["epoch"], state["batches"]
        if skip >= len(self):
            epoch, skip = epoch + 1, 0
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        self._skip = skip
