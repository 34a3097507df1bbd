"""The benchmark script runs (smoke mode), so it can never rot. It is not a timed test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.slow  # tens of seconds: CI runs it in make test-slow
def test_overhead_benchmark_smoke() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/overhead.py", "--smoke"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout[proc.stdout.index("{") :])
    for case in ("tiny_mlp", "mlp_5ms"):
        r = out["steps"][case]
        # The hand-written loop and the template's Classifier train the same model to the same loss.
        assert r["A_and_B_same_loss_5dp"], r["final_loss"]
        assert {"A", "B", "C", "L"} <= set(r["us_per_step"])
        assert r["ratio_C_over_A"]["median"] > 0
    assert out["process"]["help_wall_s"]["median"] > 0
    assert out["process"]["first_step_s"]["median"] > 0


@pytest.mark.slow
def test_gpu_benchmark_smoke_on_cpu(tmp_path) -> None:
    # The GPU benchmark's code paths at tiny sizes on CPU, so the script is known to run before
    # a GPU machine is spent on it.
    proc = subprocess.run(
        [sys.executable, "bench/gpu_bench.py", "--smoke", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=900,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "gpu_results.json").read_text())
    assert not results.get("errors")
    assert results["conv"]["rows"][0]["images_per_s"] > 0
    assert results["transformer"]["tokens_per_s"] > 0
    assert len(results["data_wait"]["rows"]) == 4
    assert all(0 <= r["data_wait_share"] <= 1 for r in results["data_wait"]["rows"])
    assert [r["recipe"] for r in results["lm_recipes"]["rows"]] == ["gpt", "gpt_modern"]
    assert all(r["tokens_per_s"] > 0 for r in results["lm_recipes"]["rows"])
    assert [r["variant"] for r in results["recipe"]["rows"]] == ["eager fp32", "recipe"]
    assert all(r["images_per_s"] > 0 for r in results["recipe"]["rows"])
    assert "| variant | images/s |" in (tmp_path / "gpu_results.md").read_text()


@pytest.mark.slow  # the standard library's sources read and compressed: ~15 s
def test_lm_recipes_benchmark_smoke(tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "bench/lm_recipes.py", "--steps", "4", "--every", "2", "--block", "32",
         "--batch", "4", "--eval-windows", "8", "--recipes", "gpt_modern", "no_muon",
         "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "lm_recipes.json").read_text())
    assert list(result["recipes"]) == ["gpt", "gpt_modern", "no_muon"]  # the baseline first
    for row in result["recipes"].values():
        assert [p["step"] for p in row["curve"]] == [0, 2, 4]
        assert row["cpu_s_per_step"] > 0 and row["tokens_per_s"] > 0
    assert result["recipes"]["gpt"]["step_cost_vs_gpt"] == 1.0
    assert (tmp_path / "lm_recipes.png").stat().st_size > 0
    assert "| gpt_modern |" in proc.stdout


@pytest.mark.slow  # two runs to their first step (tens of seconds): CI runs it in make test-slow
def test_startup_benchmark_smoke() -> None:
    proc = subprocess.run(
        [sys.executable, "bench/startup.py", "--smoke"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {ln.split("|")[1].strip(): ln for ln in proc.stdout.splitlines() if ln.startswith("| ")}
    # every phase of both, each a duration (a stamp out of order would show a negative one)
    for phase in ("interpreter", "imports", "compose", "build", "setup", "first step"):
        ours, floor = (float(x) for x in rows[phase].split("|")[2:4])
        assert ours >= 0 and floor >= 0, rows[phase]
    assert "`train.py --cfg job`" in proc.stdout


@pytest.mark.slow  # worker processes start: seconds
def test_stateful_loader_benchmark_smoke(tmp_path) -> None:
    pytest.importorskip("torchdata")  # not a dependency: the comparison is with it
    out = tmp_path / "loaders.json"
    proc = subprocess.run(
        [sys.executable, "bench/stateful_loader.py", "--rounds", "1", "--batches", "5",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(out.read_text())
    for name in ("ResumableLoader", "StatefulDataLoader"):
        assert results[f"{name}/calls_per_batch"] > 0
        assert results[f"{name}/workers=2/us_per_batch"] > 0
