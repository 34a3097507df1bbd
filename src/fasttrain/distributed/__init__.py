"""Strategies Lightning lacks, registered by name so `trainer.strategy=<name>` finds them.

Importing this package registers them; fasttrain.assemble imports it, so every config
that builds the trainer can name them.
"""

from lightning.pytorch.strategies import StrategyRegistry

from fasttrain.distributed.dp import DataParallelStrategy, reduce_replica_outputs

if "dp" not in StrategyRegistry:
    StrategyRegistry.register(
        "dp", DataParallelStrategy, description="nn.DataParallel over the local GPUs"
    )

__all__ = ["DataParallelStrategy", "reduce_replica_outputs"]
