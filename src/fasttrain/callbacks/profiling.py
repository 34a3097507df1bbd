"""Debugging and profiling callbacks: NVTX ranges for Nsight Systems, and a one-time shape log.

nsys profile -t cuda,nvtx -o fasttrain python train.py debug=nvtx
python train.py debug=shapes
"""

from __future__ import annotations

import logging
from typing import Any

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.hooks import RemovableHandle

from fasttrain.config.errors import UserError

log = logging.getLogger(__name__)


class NvtxRanges(L.Callback):
    """Nested NVTX ranges per training step: `train_step <i>` holding `forward` (the training
    step up to the loss), `backward` and `optimizer_step`, so an Nsight Systems timeline shows
    which phase each CUDA kernel belongs to. Raises a UserError on a machine without CUDA.
    """

    def __init__(self) -> None:
        super().__init__()
        if not torch.cuda.is_available():
            raise UserError(
                "NVTX ranges are read by Nsight Systems from a CUDA run, and this machine has no "
                "CUDA GPU (torch.cuda.is_available() is False); run debug=nvtx on a GPU machine"
            )
        self._depth = 0

    # torch.cuda.nvtx is looked up on each call, so a test can record the ranges on a CPU.
    def _push(self, name: str) -> None:
        torch.cuda.nvtx.range_push(name)
        self._depth += 1

    def _pop(self) -> None:
        if self._depth:
            torch.cuda.nvtx.range_pop()
            self._depth -= 1

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._push(f"train_step {trainer.global_step}")
        self._push("forward")

    def on_before_backward(
        self, trainer: L.Trainer, pl_module: L.LightningModule, loss: torch.Tensor
    ) -> None:
        self._pop()  # forward
        self._push("backward")

    def on_after_backward(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._pop()  # backward

    def on_before_optimizer_step(
        self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer: Any
    ) -> None:
        self._push("optimizer_step")

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        # Whatever is open: optimizer_step (absent on accumulating micro-batches), the step.
        while self._depth:
            self._pop()


def describe(obj: Any) -> str:
    """`float32[64, 1, 8, 8]` for a tensor; tuples, lists and dicts element by element."""
    if isinstance(obj, torch.Tensor):
        return f"{str(obj.dtype).removeprefix('torch.')}{list(obj.shape)}"
    if isinstance(obj, (list, tuple)):
        return "(" + ", ".join(describe(o) for o in obj) + ")"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{k}: {describe(v)}" for k, v in obj.items()) + "}"
    return type(obj).__name__


class ShapeLogger(L.Callback):
    """Logs each submodule's input and output shapes and dtypes the first time it runs.

    Forward hooks go through `module(x)` (`__call__`), so nothing in the model changes; each hook
    removes itself after one call. Lines read `shape  net.features.0 (Conv2d): in
    (float32[64, 1, 8, 8]) -> out float32[64, 32, 8, 8]` and land in the run's log file too.
    """

    def __init__(self) -> None:
        super().__init__()
        self._handles: dict[str, RemovableHandle] = {}
        self._armed = False

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        # Once per run: fit's setup arms the hooks; test after fit finds them spent.
        if self._armed or not trainer.is_global_zero:
            return
        self._armed = True
        for name, module in pl_module.named_modules():
            label = f"{name or '<model>'} ({type(module).__name__})"
            self._handles[label] = module.register_forward_hook(self._hook(label))

    def _hook(self, label: str) -> Any:
        def hook(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
            _log_shape(f"shape  {label}: in {describe(args)} -> out {describe(output)}")
            self._handles.pop(label).remove()

        return hook

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        for handle in self._handles.values():
            handle.remove()
        self._handles.clear()


@rank_zero_only
def _log_shape(line: str) -> None:
    log.info(line)
