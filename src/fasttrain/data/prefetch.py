"""`data.device_prefetch=true`: copy batch i+1 to the GPU on a side CUDA stream while step i runs.

A plain loop copies each batch right before its step, so the GPU waits for the copy. Here the
copy of the next batch is issued on a second stream from pinned host memory (non_blocking), and
the compute stream only waits for it when that batch is needed. Lightning's own transfer then
finds the batch already on the device and does nothing.

The prefetch is a DataLoader subclass (mixin), not a wrapper: Lightning still recognises the
loader and re-creates it with a DistributedSampler under DDP, keeping `prefetch_to`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor
from torch.utils.data import DataLoader

from fasttrain.data.resumable import ResumableLoader


def prefetch_to_cuda(batches: Iterator[Any], device: torch.device) -> Iterator[Any]:
    """Yield `batches` already on `device`, the next one's copy overlapping the current step."""
    stream = torch.cuda.Stream(device)

    def issue_copy() -> Any:
        try:
            batch = next(batches)
        except StopIteration:
            return StopIteration
        with torch.cuda.stream(stream):
            # Asynchronous only from pinned memory (data.pin_memory, "auto" pins on CUDA).
            return apply_to_collection(batch, Tensor, lambda t: t.to(device, non_blocking=True))

    compute = torch.cuda.current_stream(device)
    upcoming = issue_copy()
    while upcoming is not StopIteration:
        compute.wait_stream(stream)  # the batch's copy is done before the step reads it
        batch = upcoming
        # Memory allocated on the side stream but used on the compute stream: tell the caching
        # allocator, or it may hand the block out again while the step still reads it.
        apply_to_collection(batch, Tensor, lambda t: t.record_stream(compute))
        upcoming = issue_copy()
        yield batch


class DevicePrefetch:
    """DataLoader mixin: with `prefetch_to` a CUDA device, iterate through prefetch_to_cuda."""

    def __init__(self, *args: Any, prefetch_to: str | torch.device | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.prefetch_to = prefetch_to  # same name as the argument: Lightning re-creates loaders

    def __iter__(self) -> Iterator[Any]:
        batches = super().__iter__()  # type: ignore[misc]
        device = torch.device(self.prefetch_to) if self.prefetch_to is not None else None
        if device is None or device.type != "cuda":
            return batches
        return prefetch_to_cuda(iter(batches), device)


# Defined at import time, not on demand: Lightning records the init arguments of every DataLoader
# subclass that exists when a loader is made, which it needs to re-create it under DDP.
# __iter__ may return a generator, not a _BaseDataLoaderIter: for-loops and Lightning only iterate.
class PrefetchDataLoader(DevicePrefetch, DataLoader):  # type: ignore[misc]
    pass


class PrefetchResumableLoader(DevicePrefetch, ResumableLoader):  # type: ignore[misc]
    pass


PREFETCHING: dict[type[DataLoader[Any]], type[DataLoader[Any]]] = {
    DataLoader: PrefetchDataLoader,
    ResumableLoader: PrefetchResumableLoader,
}
