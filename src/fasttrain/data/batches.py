"""In-memory splits served a batch at a time, on the host or on the accelerator.

A DataLoader over a TensorDataset calls `__getitem__` once per sample and stacks the samples in
`collate`: ~5 us of Python per sample, a 64-sample batch of 8x8 digits spends more time there
than in the step. `Batched` takes the batch's indices at once (DataLoader's `__getitems__`
protocol): one index tensor, one gather per tensor, no collate. The sampler and the batch
sampler are DataLoader's own, so the order (seed, epoch, mid-epoch resume) and Lightning's
DistributedSampler under DDP (each rank its own shard) are those of the sample-wise loader.

`data.on_device=true` goes one step further: the split is copied to the accelerator once, the
epoch's indices cross once per epoch, and each batch is a slice of them and a gather there: no
host-to-device copy per step, nothing to pin. Same batches, same order as the host path.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from fasttrain.config.errors import UserError
from fasttrain.data.resumable import ResumableLoader, first_epoch

GB = 1e9


class Batched(TensorDataset):
    """A TensorDataset whose batches are one gather: DataLoader hands `__getitems__` the batch's
    indices; `dataset[i]` still gives one sample."""

    def __getitems__(self, indices: Sequence[int]) -> tuple[Tensor, ...]:
        index = torch.as_tensor(indices, device=self.tensors[0].device)
        return tuple(t.index_select(0, index) for t in self.tensors)


def as_batch(batch: Any) -> Any:
    """DataLoader's `collate_fn` for `Batched`: the gather already made the batch."""
    return batch


def device_batches(
    tensors: Sequence[Tensor], batches: Iterable[Sequence[int]]
) -> Iterator[tuple[Tensor, ...]]:
    """Gather `batches` of indices from `tensors` (on the device): the pass's indices are copied
    there once (from pinned memory, asynchronously), then each batch is a slice and a gather."""
    batches = list(batches)
    if not batches:
        return
    device = tensors[0].device
    host = torch.tensor(list(itertools.chain.from_iterable(batches)), dtype=torch.long)
    if device.type == "cuda":
        host = host.pin_memory()
    flat = host.to(device, non_blocking=True)  # [samples of the pass]
    start = 0
    for batch in batches:
        index = flat[start : start + len(batch)]
        start += len(batch)
        yield tuple(t.index_select(0, index) for t in tensors)


class DeviceLoader(DataLoader):
    """Validation and test batches of a split already on the device (no workers, no pinning)."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator
        assert self.batch_sampler is not None
        return device_batches(self.dataset.tensors, self.batch_sampler)  # type: ignore[attr-defined]


class DeviceResumableLoader(ResumableLoader):
    """Training batches of a split on the device, resuming mid-epoch like ResumableLoader."""

    def _batches(self) -> Iterable[Any]:
        assert self.batch_sampler is not None
        remaining = itertools.islice(self.batch_sampler, self._skip, None)
        return device_batches(self.dataset.tensors, remaining)  # type: ignore[attr-defined]


def device_loader(
    splits: dict[str, TensorDataset],
    moved: dict[str, Batched],
    split: str,
    shuffle: bool,
    trainer: Any,
    seed: int,
    batch_size: int,
) -> DataLoader:
    """data.on_device: `split` of `splits` moves to the trainer's device on first use (kept in
    `moved`); the same sampler and batch sampler as the host path, so the same batches in the
    same order, and training (`shuffle`) resumes mid-epoch."""
    device = trainer.strategy.root_device if trainer is not None else torch.device("cpu")
    if split not in moved:
        check_fits_on({k: v for k, v in splits.items() if k not in moved}, device)  # still to move
        moved[split] = Batched(*(t.to(device) for t in splits[split].tensors))
    dataset = moved[split]
    if shuffle:
        epoch = first_epoch(trainer)
        return DeviceResumableLoader(dataset, seed=seed, epoch=epoch, batch_size=batch_size)
    return DeviceLoader(dataset, batch_size=batch_size)


def check_fits_on(splits: dict[str, TensorDataset], device: torch.device) -> None:
    """Refuse, in one line, splits that do not fit in the device's free memory (with a margin for
    the model and its activations)."""
    if device.type != "cuda":
        return  # host memory: the splits are there already
    size = sum(t.numel() * t.element_size() for s in splits.values() for t in s.tensors)
    free, _ = torch.cuda.mem_get_info(device)
    if size > 0.9 * free:
        raise UserError(
            f"data.on_device=true: the data set takes {size / GB:.2f} GB, more than the "
            f"{free / GB:.2f} GB free on {device} (less a 10% margin); use data.on_device=false "
            "(batches then cross from host memory, one per step)"
        )
