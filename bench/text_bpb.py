"""How well the language model compresses text: test-split bits per byte of `model=gpt data=text`
(the default corpus: the running Python's standard library sources) after a fixed CPU budget,
next to gzip -9, xz -9 and the bigram model on the same test split.

    python bench/text_bpb.py             # 6 epochs (768 steps): bench/results/text_bpb.json
    python bench/text_bpb.py --epochs 1  # a quick look

The run is `python train.py model=gpt data=text trainer.max_epochs=N` as a user types it; its
test/bpb is the best checkpoint's on the test split (fixed windows, fasttrain.data.text).
"""

from __future__ import annotations

import argparse
import gzip
import json
import lzma
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def splits() -> dict[str, bytes]:
    """The default corpus's splits, as data=text makes them (seed 42, 5% val, 5% test)."""
    from fasttrain.data.corpus import corpus_files, read_documents, split_documents

    root, files = corpus_files(None)
    documents = read_documents(root, files, None)
    return {s: b"".join(d) for s, d in split_documents(documents, 0.05, 0.05, 42).items()}


def baselines(parts: dict[str, bytes]) -> dict[str, float]:
    from fasttrain.data.corpus import bigram_bits_per_byte

    test = parts["test"]
    return {
        "gzip_9": 8 * len(gzip.compress(test, compresslevel=9)) / len(test),
        "xz_9": 8 * len(lzma.compress(test, preset=9)) / len(test),
        "bigram": bigram_bits_per_byte(parts["train"], test),
    }


def train(epochs: int, out: Path) -> tuple[dict[str, float], float]:
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "model=gpt", "data=text",
         f"trainer.max_epochs={epochs}", "run_name=bpb", f"paths.root_dir={out}"],
        cwd=ROOT, capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    seconds = time.perf_counter() - start
    if proc.returncode:
        sys.exit(proc.stderr[-3000:])
    record = json.loads((out / "logs" / "train" / "bpb" / "metrics.json").read_text())
    return record["metrics"], seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    args = parser.parse_args()
    parts = splits()
    base = baselines(parts)
    with tempfile.TemporaryDirectory() as tmp:
        metrics, seconds = train(args.epochs, Path(tmp))
    result = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs (torch threads: default)",
        "corpus": "this Python's standard library .py sources (tests left out), byte tokens",
        "test_bytes": len(parts["test"]),
        "epochs": args.epochs,
        "steps": args.epochs * 128,
        "train_wall_s": round(seconds, 1),
        "test_bpb": metrics["test/bpb"],
        **{k: round(v, 4) for k, v in base.items()},
    }
    print(json.dumps(result, indent=2))
    if args.epochs == 6:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "text_bpb.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
