"""fasttrain: a PyTorch Lightning + Hydra template for training models fast on GPUs.

Importing the package is cheap on purpose: torch and Lightning load only when a task runs, so
`python train.py --help` answers in well under a second.
"""

__version__ = "0.1.0"

from pathlib import Path

# conf/ sits at the repository root beside src/ (the project is installed editable).
# An absolute path: Hydra would read a relative one as a Python package when the entry
# point is imported as a module (python -m fasttrain.evaluate).
CONFIG_DIR = str(Path(__file__).resolve().parents[2] / "conf")


def _overrides_suffix() -> str:
    """`${overrides_suffix:}` in conf/: "_" + the job's overrides as one folder name, e.g.
    "_data.batch_size=128,seed=1"; "" without overrides, or outside a Hydra app (compose API).
    A group selection like model/net=mlp keeps no "/", so it stays one folder."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return ""
    overrides = HydraConfig.get().job.override_dirname
    return f"_{overrides.replace('/', '.')}"[:150] if overrides else ""


def _register_resolvers() -> None:
    # Registered on import, so every entry point and every test that composes conf/ has it.
    from omegaconf import OmegaConf

    OmegaConf.register_new_resolver("overrides_suffix", _overrides_suffix, replace=True)


_register_resolvers()
