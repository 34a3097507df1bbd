"""From `python train.py` to the first training step, phase by phase, against a hand-written
Hydra + Lightning script doing the same work (the floor a template can reach).

    python bench/startup.py            # writes bench/results/startup.json, prints a table
    python bench/startup.py --smoke    # one round: proves the script still works (tested)

The work: the default run (`python train.py`: SmallCNN on scikit-learn's digits, TensorBoard,
checkpoints, every default callback) to the end of its first optimizer step, on the CPU.
The floor (bench/startup_floor.py): one file, `@hydra.main` on a three-key config, the same
data set, a small CNN, a TensorBoardLogger and a ModelCheckpoint, `Trainer.fit`.

Phases, from time stamps each process writes (its start taken by the parent before Popen):
  interpreter  process start -> first line of the probe (Python itself)
  imports      -> the modules a run needs are imported (torch, Lightning, the entry point)
  compose      -> the config composed and checked (fasttrain: the command-line check, the run
               folder claimed, Hydra's own composition; up to the call of build_run)
  build        -> data module, model, callbacks, loggers and Trainer built
  setup        -> Lightning's on_train_start (data set loaded and split, loaders, sanity check)
  first step   -> the first optimizer step ended
Rounds interleave fasttrain and the floor (ABAB...), so drift on the machine hits both alike;
medians over rounds. Also: `train.py --help` and `train.py --cfg job` (no heavy import).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("interpreter", "imports", "compose", "build", "setup", "first_step")
# What a default run is cut to: one step, then stop (the timeline callback ends the process).
SHORT = ["trainer.max_epochs=1", "++trainer.limit_train_batches=1", "++trainer.limit_val_batches=1",
         "test=false"]  # fmt: skip


def timed(cmd: list[str], stamps: Path, cwd: Path) -> dict[str, float]:
    """Run `cmd` (it writes its stamps to `stamps`); the phase durations in seconds."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "STARTUP_STAMPS": str(stamps),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "bench"),
                                                       os.environ.get("PYTHONPATH")]))}  # fmt: skip
    start = time.time()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[1]} failed:\n{proc.stderr[-3000:]}")
    t = json.loads(stamps.read_text())
    points = [start, t["probe"], t["imported"], t["composed"], t["built"], t["train_start"],
              t["first_step_end"]]  # fmt: skip
    return {name: b - a for name, a, b in zip(PHASES, points[:-1], points[1:], strict=True)}


def wall(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, capture_output=True, check=True, timeout=300,
                   env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # fmt: skip
    return time.perf_counter() - start


def measure(rounds: int, scratch: Path) -> dict[str, Any]:
    runs: dict[str, list[dict[str, float]]] = {"fasttrain": [], "floor": []}
    for i in range(rounds):
        logs = scratch / f"logs_{i}"
        probe = str(ROOT / "bench" / "startup_probe.py")
        fasttrain = [sys.executable, probe, *SHORT, f"paths.log_dir={logs}", f"run_name=r{i}",
                     "callbacks.progress_bar=null"]  # fmt: skip
        floor = [sys.executable, str(ROOT / "bench" / "startup_floor.py"),
                 f"hydra.run.dir={logs}/floor_{i}"]  # fmt: skip
        order = [("fasttrain", fasttrain), ("floor", floor)]
        for name, cmd in order if i % 2 == 0 else order[::-1]:
            runs[name].append(timed(cmd, scratch / f"{name}_{i}.json", scratch))
    light = {
        "help_s": [wall([sys.executable, "train.py", "--help"]) for _ in range(rounds)],
        "cfg_job_s": [wall([sys.executable, "train.py", "--cfg", "job"]) for _ in range(rounds)],
    }
    return {
        "phases_s": {
            name: {p: statistics.median(r[p] for r in rs) for p in PHASES}
            for name, rs in runs.items()
        },
        "to_first_step_s": {name: sorted(sum(r.values()) for r in rs) for name, rs in runs.items()},
        **{k: statistics.median(v) for k, v in light.items()},
        "rounds": rounds,
    }


def table(result: dict[str, Any]) -> str:
    phases = result["phases_s"]
    lines = ["| phase | fasttrain s | floor s | fasttrain − floor s |", "|---|---|---|---|"]
    for p in PHASES:
        a, b = phases["fasttrain"][p], phases["floor"][p]
        lines.append(f"| {p.replace('_', ' ')} | {a:.2f} | {b:.2f} | {a - b:+.2f} |")
    total = {k: statistics.median(v) for k, v in result["to_first_step_s"].items()}
    ours, floor = total["fasttrain"], total["floor"]
    lines.append(f"| **to the first step** | **{ours:.2f}** | **{floor:.2f}** | "
                 f"**{ours - floor:+.2f}** |")  # fmt: skip
    lines.append(f"\n`train.py --help` {result['help_s']:.2f} s, `train.py --cfg job` "
                 f"{result['cfg_job_s']:.2f} s (medians of {result['rounds']}).")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="one round, no results written")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "startup.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        result = measure(1 if args.smoke else args.rounds, Path(scratch))
    print(table(result))
    if not args.smoke:
        import platform

        result["machine"] = {"logical_cpus": len(os.sched_getaffinity(0)),
                             "python": platform.python_version()}  # fmt: skip
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
