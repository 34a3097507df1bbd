"""PerfMonitor: the perf/ scalars are logged, the data-wait share is real, MFU peaks are dense."""

from __future__ import annotations

import json
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from omegaconf import OmegaConf
from test_configs import compose_for
from torch import nn
from torch.utils.data import DataLoader, Dataset

from conftest import scalars
from fasttrain.assemble import build
from fasttrain.callbacks.flops import dense_peak_tflops, flops_per_sample, matmul_dtype
from fasttrain.callbacks.perf import PerfMonitor
from fasttrain.config.errors import UserError

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("NVIDIA H200", "bf16", 989.4),  # Lightning 2.6 finds no entry for this name
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.7),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0),
        ("NVIDIA A100 80GB PCIe", "fp16", 312.0),
        ("NVIDIA H100 PCIe", "bf16", 756.5),
        ("NVIDIA H200 NVL", "bf16", 835.5),
        ("NVIDIA L40S", "bf16", 362.0),
        ("NVIDIA L4", "bf16", 121.0),
        ("Tesla T4", "fp16", 65.0),
        ("Tesla T4", "bf16", None),  # no bf16 Tensor Cores: no MFU rather than a wrong one
        ("NVIDIA GeForce GTX 1080", "fp32", None),
    ],
)
def test_dense_peak_table_matches_device_names(name: str, dtype: str, peak: float | None) -> None:
    assert dense_peak_tflops(name, dtype) == peak


def test_matmul_dtype_follows_precision() -> None:
    assert matmul_dtype("bf16-mixed") == "bf16"
    assert matmul_dtype("16-mixed") == "fp16"
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert matmul_dtype("32-true") == "fp32"
        torch.set_float32_matmul_precision("high")
        assert matmul_dtype("32-true") == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)


def test_flops_are_counted_on_meta_without_touching_the_model() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    stats = model[1].running_mean.clone()
    batch = (torch.randn(8, 4), torch.zeros(8, dtype=torch.long))
    # Linear: forward 2*4*3 per sample, backward (weight gradient only; the input needs none)
    # the same again; BatchNorm's few elementwise ops are not matmuls and count as zero.
    assert flops_per_sample(model, batch) == 48
    assert all(p.grad is None and p.device.type == "cpu" for p in model.parameters())
    assert torch.equal(model[1].running_mean, stats) and model[1].num_batches_tracked == 0


def test_peak_tflops_must_be_positive() -> None:
    node = OmegaConf.create({"_target_": "fasttrain.callbacks.perf.PerfMonitor", "peak_tflops": 0})
    with pytest.raises(UserError, match=r"^callbacks\.perf\.peak_tflops=0: expected a number > 0"):
        build(node, "callbacks.perf")


def test_perf_scalars_and_summary_of_a_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fasttrain.tasks import train

    # peak_tflops enables perf/mfu on a CPU (the table only knows GPUs).
    overrides = ["trainer.log_every_n_steps=2", "callbacks.perf.peak_tflops=1"]
    train(compose_for("debug/limit.yaml", tmp_path, overrides))
    run = tmp_path / "run"
    logged = scalars(run)
    for tag in ("samples_per_sec", "step_time_ms", "data_wait_share", "cpu_util_pct", "mfu"):
        values = logged[f"perf/{tag}"]
        assert len(values) == 5, tag  # 2 epochs x 5 batches, one window every 2 batches
        assert all(v >= 0 for v in values), tag
    assert not any(tag.startswith("perf/gpu") for tag in logged)  # no CUDA here
    assert all(0 <= v <= 1 for v in logged["perf/data_wait_share"])
    assert all(v > 0 for v in logged["perf/samples_per_sec"] + logged["perf/mfu"])
    summary = json.loads((run / "perf_summary.json").read_text())
    assert summary["steps"] == 10 and summary["device"] == "cpu"
    assert 0 < summary["step_time_ms_median"] <= summary["step_time_ms_p90"]
    assert summary["flops_per_sample"] > 0 and summary["peak_tflops"] == 1
    assert summary["mfu"] == pytest.approx(
        summary["flops_per_sample"] * summary["samples_per_sec"] / 1e12
    )
    assert "performance (10 steps on cpu)" in capsys.readouterr().out


class SlowData(Dataset):
    """64 random samples; each item costs `delay` seconds, like a slow decode or disk read."""

    def __init__(self, delay: float) -> None:
        self.delay, self.x = delay, torch.randn(64, 4)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay:
            time.sleep(self.delay)
        return self.x[i], torch.tensor(i % 2)


class SlowDataModule(L.LightningDataModule):
    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    def train_dataloader(self) -> DataLoader:
        return DataLoader(SlowData(self.delay), batch_size=8)


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, ...], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit_tiny(delay: float, out: Path, **trainer_args: object) -> tuple[PerfMonitor, L.Trainer]:
    monitor = PerfMonitor(output_dir=str(out))
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, limit_train_batches=6, log_every_n_steps=2,
        callbacks=[monitor], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, **trainer_args,
    )  # fmt: skip
    trainer.fit(Tiny(), datamodule=SlowDataModule(delay))
    return monitor, trainer


def test_data_wait_share_rises_with_a_slow_loader(tmp_path: Path) -> None:
    delay = 0.01  # 8 items a batch: 80 ms waiting per step against ~1 ms of compute
    slow, trainer = fit_tiny(delay, tmp_path / "slow")
    fast, _ = fit_tiny(0.0, tmp_path / "fast")
    s, f = slow.summary, fast.summary
    assert s["steps"] == f["steps"] == 6
    assert s["data_wait_share"] > 0.5
    assert s["data_wait_share"] > f["data_wait_share"] + 0.3
    # The wait it measured is at least the sleeping it was given, and no more than the steps.
    waited = s["data_wait_share"] * s["train_time_s"]
    assert 6 * 8 * delay <= waited <= s["train_time_s"]
    # The fetch timing is undone after fit: the loop's own methods are back.
    assert "_on_before_fetch" not in vars(trainer.fit_loop.epoch_loop)
    assert json.loads((tmp_path / "slow" / "perf_summary.json").read_text()) == pytest.approx(s)


@pytest.mark.gpu
@CUDA
def test_cuda_memory_nvml_and_mfu_scalars(tmp_path: Path) -> None:
    from fasttrain.callbacks.board import RunLogger

    logger = RunLogger(save_dir=str(tmp_path))  # a run's logger: its names are read back
    monitor = PerfMonitor(output_dir=str(tmp_path))
    earlier = torch.empty(2**30, dtype=torch.uint8, device="cuda")  # 1 GiB, freed before the run
    del earlier
    trainer = L.Trainer(
        accelerator="gpu", devices=1, precision="bf16-mixed", max_epochs=1,
        limit_train_batches=8, log_every_n_steps=2, callbacks=[monitor], logger=logger,
        enable_checkpointing=False, enable_progress_bar=False,
    )  # fmt: skip
    trainer.fit(Tiny(), datamodule=SlowDataModule(0.0))
    logged = scalars(tmp_path)
    assert len(logged["perf/mem_allocated_gb"]) == 4
    assert all(0 < v < 0.5 for v in logged["perf/mem_peak_gb"])
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert "perf/gpu_util_pct" not in logged
    else:
        assert all(0 <= v <= 100 for v in logged["perf/gpu_util_pct"])
        assert all(v > 0 for v in logged["perf/gpu_mem_used_gb"])
    if dense_peak_tflops(torch.cuda.get_device_name(), "bf16"):
        assert all(0 < v < 1 for v in logged["perf/mfu"])
        assert 0 < monitor.summary["mfu"] < 1
    assert 0 < monitor.summary["mem_peak_gb"] < 0.5  # this run's peak, not the earlier GiB's
