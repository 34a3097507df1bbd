"""What a mid-epoch-resumable training loader costs a batch: fasttrain's ResumableLoader
against torchdata's StatefulDataLoader, the library's loader for the same job.

    pip install torchdata            # not a fasttrain dependency; the script says so without it
    python bench/stateful_loader.py  # writes bench/results/stateful_loader.json, prints a table
    python bench/stateful_loader.py --rounds 1 --batches 5 --out /tmp/x.json   # a smoke run

Both serve the same shuffled epochs of a fasttrain `Batched` data set (one gather a batch, the
default data path) with the same batch size, on the CPU, single-threaded; both are resumed
mid-epoch by a state dict (StatefulDataLoader's `RandomSampler` is its own stateful one).
Per loader and number of workers: the time a batch takes to come out of the loader (median of
interleaved rounds) and, without workers, the Python calls a batch makes (exact: counted with
sys.setprofile). With workers, StatefulDataLoader snapshots each worker's state every
`snapshot_every_n_steps` batches (default 1: every batch), sent back with the batch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "stateful_loader.json"
SAMPLES, FEATURES, BATCH = 8192, 64, 64


def loaders(workers: int) -> dict[str, Any]:
    from torchdata.stateful_dataloader import StatefulDataLoader

    from fasttrain.data.batches import Batched, as_batch
    from fasttrain.data.resumable import ResumableLoader

    data = Batched(torch.randn(SAMPLES, FEATURES), torch.randint(0, 10, (SAMPLES,)))
    common: dict[str, Any] = {"batch_size": BATCH, "collate_fn": as_batch, "num_workers": workers}
    if workers:
        common["persistent_workers"] = True
    return {
        "ResumableLoader": ResumableLoader(data, seed=0, **common),
        "StatefulDataLoader": StatefulDataLoader(data, shuffle=True, **common),
    }


def per_batch_s(loader: Any, batches: int) -> float:
    it = iter(loader)
    next(it)  # workers started, first batch out
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return (time.perf_counter() - start) / batches


def calls_per_batch(loader: Any, batches: int) -> float:
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    it = iter(loader)
    next(it)
    sys.setprofile(profile)
    try:
        for _ in range(batches):
            next(it)
    finally:
        sys.setprofile(None)
    return count / batches


def resumes_where_it_stopped(loader: Any) -> bool:
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    rest = [b[1].tolist() for b in it]
    loader.load_state_dict(state)
    return [b[1].tolist() for b in loader] == rest


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    try:
        import torchdata  # noqa: F401
    except ImportError:
        sys.exit("needs torchdata: pip install torchdata")
    torch.set_num_threads(1)
    results: dict[str, Any] = {}
    for workers in (0, 2):
        made = loaders(workers)
        if workers == 0:
            for name, loader in made.items():
                assert resumes_where_it_stopped(loader), name
                results[f"{name}/calls_per_batch"] = calls_per_batch(loader, args.batches)
        times: dict[str, list[float]] = {name: [] for name in made}
        for _ in range(args.rounds):
            for name, loader in made.items():
                times[name].append(per_batch_s(loader, args.batches))
        for name, got in times.items():
            results[f"{name}/workers={workers}/us_per_batch"] = statistics.median(got) * 1e6
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for key, value in results.items():
        print(f"{key:50s} {value:10.1f}")


if __name__ == "__main__":
    main()
