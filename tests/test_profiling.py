"""debug=profile|profile_simple|shapes|nvtx write what they promise; nvtx stops cleanly on CPU."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning as L
import pytest
import torch
from test_configs import compose_for
from test_perf import SlowDataModule, Tiny

from conftest import run_cli, run_dirs
from fasttrain.callbacks.profiling import NvtxRanges

# A short fit and no test stage: the files come from the training loop.
SHORT = ["data.num_workers=0", "test=false"]


def test_profile_writes_a_trace_and_a_summary(tmp_path: Path) -> None:
    from fasttrain.tasks import train

    # 5 steps: one cycle of Lightning's schedule (skip 1, warm up 1, record 3).
    train(compose_for("debug/profile.yaml", tmp_path, [*SHORT, "trainer.limit_train_batches=5"]))
    out = tmp_path / "run" / "profiler"
    traces = sorted(out.glob("*training_step*.pt.trace.json"))
    assert traces, sorted(p.name for p in out.iterdir())
    events = json.loads(traces[0].read_text())["traceEvents"]
    assert any("training_step" in e.get("name", "") for e in events)
    summary = (out / "fit-profile.txt").read_text()
    assert "Self CPU time total" in summary and "aten::" in summary


def test_profile_simple_times_the_dataloader(tmp_path: Path) -> None:
    from fasttrain.tasks import train

    train(
        compose_for(
            "debug/profile_simple.yaml", tmp_path, [*SHORT, "trainer.limit_train_batches=3"]
        )
    )
    report = (tmp_path / "run" / "profiler" / "fit-simple.txt").read_text()
    assert "train_dataloader_next" in report and "run_training_batch" in report


def test_shapes_logs_each_module_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from fasttrain.tasks import train

    with caplog.at_level(logging.INFO, logger="fasttrain.callbacks.profiling"):
        train(compose_for("debug/shapes.yaml", tmp_path))  # fit and test: hooks fire once
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("shape  ")]
    labels = [line.split(":")[0] for line in lines]
    assert len(labels) == len(set(labels))
    assert "shape  net.features.0 (Conv2d): in (float32[64, 1, 8, 8]) -> out float32[64, " in (
        "\n".join(lines)
    )
    assert any(line.startswith("shape  net (SmallCNN): ") for line in lines)  # the task's net
    assert any(line.endswith("-> out float32[64, 10]") for line in lines)  # the logits


def test_nvtx_without_cuda_is_one_clear_line(tmp_path: Path) -> None:
    res = run_cli(["train.py", "debug=nvtx"], tmp_path)
    assert res.returncode == 2
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in res.stderr
    assert errors[0].startswith("error: callbacks.nvtx: ") and "CUDA GPU" in errors[0]
    assert run_dirs(tmp_path) == []  # nothing left behind


def test_nvtx_ranges_nest_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # The range logic on a CPU: torch.cuda.nvtx's functions record instead of calling NVTX.
    events: list[str] = []
    with monkeypatch.context() as m:
        m.setattr(torch.cuda, "is_available", lambda: True)
        ranges = NvtxRanges()
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: events.append(name))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: events.append("pop"))
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, limit_train_batches=4, accumulate_grad_batches=2,
        callbacks=[ranges], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Tiny(), datamodule=SlowDataModule(0.0))

    def step(n: int, optimizer: bool) -> list[str]:
        inner = ["forward", "pop", "backward", "pop"] + (
            ["optimizer_step", "pop"] if optimizer else []
        )
        return [f"train_step {n}", *inner, "pop"]

    # Two micro-batches per optimizer step: only the second one steps the optimizer.
    assert events == step(0, False) + step(0, True) + step(1, False) + step(1, True)
