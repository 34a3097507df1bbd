"""The benchmark script runs (smoke mode), so it can never rot. It is not a timed test."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO


def test_overhead_benchmark_smoke() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/overhead.py", "--smoke"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    for case in ("tiny_mlp", "conv_5ms"):
        r = out["steps"][case]
        # The hand-written loop and the template's Classifier train the same model to the same loss.
        assert r["A_and_B_same_loss_5dp"], r["final_loss"]
        assert {"A", "B", "C"} <= set(r["us_per_step"])
        assert r["ratio_C_over_A"]["median"] > 0
    assert out["process"]["help_wall_s"]["median"] > 0
    assert out["process"]["first_step_s"]["median"] > 0
