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
