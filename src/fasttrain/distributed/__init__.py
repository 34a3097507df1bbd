"""Multi-process and multi-device training pieces Lightning lacks.

- `dp`: the DataParallel strategy, registered by name (`trainer.strategy=dp`) when that module
  is imported; fasttrain.assemble imports it before any Trainer is built.
- `multirun`: DDP ranks inside a Hydra sweep.

Kept free of imports: every command line imports `multirun` (through this package) before it
knows whether it will train; `python train.py --cfg job` must not pay for Lightning.
"""
