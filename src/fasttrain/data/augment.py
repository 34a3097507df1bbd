"""Batched augmentation on the accelerator: pad-and-crop and horizontal flips of a whole batch.

For data held on the device (`data.on_device=true`) there are no loader workers to augment in;
the batch is augmented where it already is, after Lightning's transfer hook, in training only.
Per sample, a random shift (a crop of the zero-padded image) and a coin-flip mirror are drawn on
the device and applied as one gather: no host sync, no shape that depends on the data, so the
training step stays sync-free (tests/test_hot_path.py) and torch.compile-friendly.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from fasttrain.data.resumable import position_seed


class PadCropFlip:
    """[B, C, H, W] (any dtype) -> the same shape and dtype: each image zero-padded by `padding`,
    cropped back to H x W at a random offset, and mirrored left-right with probability 0.5 when
    `flip`. Random draws use `generator` (on the batch's device), else torch's default one."""

    def __init__(self, padding: int = 4, flip: bool = True) -> None:
        if padding < 0:
            raise ValueError(f"padding must be >= 0, got {padding}")
        self.padding, self.flip = padding, flip

    def __call__(self, x: Tensor, generator: torch.Generator | None = None) -> Tensor:
        b, _, h, w = x.shape
        p, device = self.padding, x.device
        # offsets into the padded image, [B] each; 0..2p (p = the unshifted image)
        dy = torch.randint(0, 2 * p + 1, (b,), device=device, generator=generator)
        dx = torch.randint(0, 2 * p + 1, (b,), device=device, generator=generator)
        rows = dy[:, None] + torch.arange(h, device=device)  # [B, H]
        cols = dx[:, None] + torch.arange(w, device=device)  # [B, W]
        if self.flip:
            mirror = torch.rand(b, device=device, generator=generator) < 0.5  # [B]
            # reading the crop's columns right to left mirrors it
            cols = torch.where(mirror[:, None], cols.flip(1), cols)
        padded = F.pad(x, (p, p, p, p)) if p else x  # [B, C, H + 2p, W + 2p], zeros around
        batch = torch.arange(b, device=device)[:, None, None, None]
        channel = torch.arange(x.shape[1], device=device)[None, :, None, None]
        # one gather: out[b, c, i, j] = padded[b, c, rows[b, i], cols[b, j]]
        return padded[batch, channel, rows[:, None, :, None], cols[:, None, None, :]]


def augment_training_batch(
    module: Any, batch: Any, augment: PadCropFlip | None, seed: int = 0
) -> Any:
    """A data module's `on_after_batch_transfer`: (x, y) with x augmented, in training only
    (validation, test and predict batches, and sanity checks, pass through unchanged).

    The draws come from a generator seeded by (seed, epoch, the batch's place in the epoch): this
    hook runs before fasttrain's per-batch reseed (ResumeState), so torch's default generator
    would give a run resumed mid-epoch other crops and flips than the uninterrupted one."""
    trainer = getattr(module, "trainer", None)
    if augment is None or trainer is None or not trainer.training:
        return batch
    x, y = batch
    # Private: Lightning has no public count of the epoch's batches at transfer time; the
    # counter is restored on a mid-epoch resume (tests/test_architecture.py guards the name).
    place = int(trainer.fit_loop.epoch_loop.batch_progress.current.ready)
    value = position_seed(seed, int(trainer.current_epoch), place)
    generator = torch.Generator(device=x.device).manual_seed(value)
    return augment(x, generator), y
