"""The runs bench/tensorboard_view.py and bench/ui_views.py show: seven short runs of three
tasks, each told apart from the others of its task by one override, as a user compares runs.

What every run of a task shares (its data, model and short-run settings) is in an experiment
file of its own (`experiment=` is left out of run names, as a user's fixed setup would be), so
each run's name is what it was given, then its start time: `lr=0.01_1207-061756`. The files go
to a temporary config folder found through `hydra.searchpath` (also left out of names).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"

EXPERIMENTS = {
    "bench_digits": """\
defaults:
  - override /data: digits
  - override /model: cnn
trainer: {max_epochs: 3}
data: {num_workers: 0}
""",
    "bench_diabetes": """\
defaults:
  - override /data: diabetes
  - override /model: regressor
trainer: {max_epochs: 5}
data: {num_workers: 0}
""",
    "bench_text": """\
defaults:
  - override /data: text
  - override /model: gpt
trainer: {max_epochs: 3}
data: {path: CORPUS, block_size: 32, batch_size: 8, val_fraction: 0.2, test_fraction: 0.2,
       windows_per_epoch: 128, eval_windows: 16, num_workers: 0}
model: {net: {n_embd: 32, n_head: 2}}
""",
}
# (experiment, the override that tells the run apart)
RUNS = (
    ("bench_digits", "model.optimizer.lr=0.01"),
    ("bench_digits", "model.optimizer.lr=0.001"),
    ("bench_digits", "data.batch_size=32"),
    ("bench_diabetes", "model.optimizer.weight_decay=0.1"),
    ("bench_diabetes", "model.net.hidden=[32]"),
    ("bench_text", "model.net.n_layer=1"),
    ("bench_text", "model.net.n_layer=2"),
)


def write_corpus(root: Path) -> Path:
    """Small Python-like text files, enough for every split at block_size 32."""
    rng = random.Random(0)
    words = ["def", "return", "self", "value", "import", "class", "for", "in", "if", "x", "y"]
    root.mkdir(parents=True)
    for i in range(20):
        lines = (" ".join(rng.choice(words) for _ in range(6)) for _ in range(60))
        (root / f"doc{i:02d}.py").write_text("\n".join(lines) + "\n")
    return root


def write_experiments(work: Path, loggers: str) -> Path:
    """The experiment files, in `work`/conf/experiment/, logging to `loggers` ("[a,b]");
    returns that conf folder."""
    corpus = write_corpus(work / "corpus")
    folder = work / "conf" / "experiment"
    folder.mkdir(parents=True)
    for name, body in EXPERIMENTS.items():
        body = body.replace("CORPUS", str(corpus)).replace(
            "defaults:\n", f"defaults:\n  - override /logger: {loggers}\n"
        )
        text = f"# @package _global_\n{body}callbacks: {{progress_bar: null}}\n"
        (folder / f"{name}.yaml").write_text(text)
    return folder.parent


def train(log_dir: Path, work: Path, loggers: str = "[tensorboard]") -> list[str]:
    """Trains the seven runs into `log_dir` (each start is seconds after the last: names hold
    the time to the second); returns each run's stdout."""
    conf = write_experiments(work, loggers)
    python = str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    printed = []
    for experiment, override in RUNS:
        cmd = [python, "train.py", f"experiment={experiment}", override,
               f"hydra.searchpath=[file://{conf}]", f"paths.log_dir={log_dir}",
               f"paths.data_dir={work / 'data'}"]  # fmt: skip
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env=env)
        if proc.returncode:
            sys.exit(f"{override}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        printed.append(proc.stdout)
    return printed
