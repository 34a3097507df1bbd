"""DataParallel for Lightning 2.x, which removed it: one process drives every local GPU.

DataParallel is the quick way to use several GPUs of one machine (no launcher, no process group);
DDP scales better (one process per GPU, no per-step replication) and is what `trainer=ddp` runs.
Each step the module is replicated onto every GPU, the batch [B, ...] is split into
[B / n_gpus, ...] chunks, each replica runs the step, and the per-replica outputs are gathered
on the root GPU and reduced to one loss (mean) before backward.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from lightning.pytorch.strategies import ParallelStrategy, StrategyRegistry
from lightning.pytorch.utilities import rank_zero_info
from lightning_utilities.core.apply_func import apply_to_collection
from torch import Tensor, nn


def reduce_replica_outputs(outputs: Any) -> Any:
    """Gathered per-replica outputs -> one value per key: the mean over replicas.

    DataParallel gathers a scalar loss from n replicas as a vector [n]; tensors that already hold
    one value pass through unchanged (single device, or values the step reduced itself).
    """

    def mean(t: Tensor) -> Tensor:
        return t.mean() if t.numel() > 1 else t.reshape(())

    return apply_to_collection(outputs, Tensor, mean)


class _ReplicaStep(nn.Module):
    """Calls one step method (training_step, ...) of the LightningModule it wraps.

    DataParallel replicates this wrapper, so in each replica `self.module` is that replica's copy of
    the LightningModule. Only the replica on the root device logs: the others would write the same
    metric names into the one shared result collection from other threads and devices.
    """

    def __init__(self, module: nn.Module, root_device: torch.device) -> None:
        super().__init__()
        self.module = module
        self.root_device = root_device
        self.method = "training_step"

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        module = self.module
        param = next(module.parameters(), None)
        if param is not None and param.device != self.root_device:
            # An instance attribute shadows the method on this replica only (replicas are copies).
            for name in ("log", "log_dict"):
                setattr(module, name, _no_log)
        return getattr(module, self.method)(*args, **kwargs)


def _no_log(*args: Any, **kwargs: Any) -> None:
    return None


class DataParallelStrategy(ParallelStrategy):
    """`trainer=dp` / `Trainer(strategy="dp")`: nn.DataParallel over `devices`.

    With fewer than 2 devices there is nothing to split: it says so once and runs the module on
    the single device as it is. Ranks stay 0 and the world size 1: it is one process.
    """

    strategy_name = "dp"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cluster_environment=None, **kwargs)
        self._replica_step: _ReplicaStep | None = None
        self._said_single = False  # setup runs for fit and again for test: say it once

    @property
    def root_device(self) -> torch.device:
        assert self.parallel_devices, "the accelerator connector sets the devices before use"
        return self.parallel_devices[0]

    @property
    def is_distributed(self) -> bool:
        return False  # one process: no DistributedSampler, no process group

    @property
    # Lightning's base says dict, but Trainer.distributed_sampler_kwargs is Optional and only
    # read when is_distributed: None is what a single-process strategy has.
    def distributed_sampler_kwargs(self) -> None:  # type: ignore[override]
        return None

    def model_to_device(self) -> None:
        assert self.model is not None
        self.model.to(self.root_device)

    def _setup_model(self, model: nn.Module) -> nn.Module:
        devices = self.parallel_devices or []
        if len(devices) < 2:
            if not self._said_single:
                self._said_single = True
                rank_zero_info(
                    f"trainer=dp: {len(devices)} device(s) ({self.root_device}); DataParallel "
                    "needs 2 or more GPUs, so the model runs unreplicated on this device."
                )
            return model
        self._replica_step = _ReplicaStep(model, self.root_device)
        return nn.DataParallel(self._replica_step, device_ids=devices, output_device=devices[0])

    def batch_to_device(
        self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0
    ) -> Any:
        # DataParallel scatters from the root device, whatever device the caller asked for.
        # Private: Lightning has no public "run the module's transfer hooks for this device";
        # tests/test_architecture.py fails if the method goes.
        model = self.lightning_module
        if model is not None:
            return model._apply_batch_transfer_handler(
                batch, device=self.root_device, dataloader_idx=dataloader_idx
            )
        return move_data_to_device(batch, self.root_device)

    def _step(self, method: str, *args: Any, **kwargs: Any) -> Any:
        assert self.lightning_module is not None
        if self._replica_step is None or self.model is self.lightning_module:
            return getattr(self.lightning_module, method)(*args, **kwargs)
        self._replica_step.method = method
        assert self.model is not None
        return reduce_replica_outputs(self.model(*args, **kwargs))

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.train_step_context():
            return self._step("training_step", *args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.val_step_context():
            return self._step("validation_step", *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.test_step_context():
            return self._step("test_step", *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.predict_step_context():
            return self._step("predict_step", *args, **kwargs)

    def reduce(self, tensor: Any, *args: Any, **kwargs: Any) -> Any:
        return reduce_replica_outputs(tensor)

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        return None

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj

    def all_gather(self, tensor: Tensor, group: Any = None, sync_grads: bool = False) -> Tensor:
        return tensor

    def teardown(self) -> None:
        super().teardown()
        self._replica_step = None


if "dp" not in StrategyRegistry:  # `trainer.strategy=dp` names it (fasttrain.assemble imports this)
    StrategyRegistry.register(
        "dp", DataParallelStrategy, description="nn.DataParallel over the local GPUs"
    )
