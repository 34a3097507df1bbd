"""trainer=ddp_cpu through `python train.py` (2 processes, one run dir, one TensorBoard run,
metrics reduced across ranks), stacked with precision, accumulation and clipping; the DataParallel
strategy's reduction, root-device batches, root-only logging, and its single-device fallback."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from practices import compose_train

from conftest import final_metrics, run_cli, run_dirs, session_hparams
from fasttrain.distributed.dp import DataParallelStrategy, _ReplicaStep, reduce_replica_outputs


def full_split_accuracy(ckpt: str, split: str, precision: torch.dtype | None) -> float:
    """Accuracy of a checkpoint on the whole split, in this one process."""
    from fasttrain.checkpoints.load import load_task
    from fasttrain.data import DigitsDataModule

    model, _ = load_task(ckpt)
    model.eval()
    data = DigitsDataModule(num_workers=0)
    data.setup()
    x, y = data.splits[split].tensors
    with torch.no_grad(), torch.autocast("cpu", dtype=precision, enabled=precision is not None):
        return float((model(x).argmax(1) == y).float().mean())


@pytest.mark.slow  # tens of seconds: CI runs it in make test-slow
def test_ddp_cpu_stacked_with_precision_accumulation_clipping(tmp_path: Path) -> None:
    proc = run_cli(
        ["train.py", "trainer=ddp_cpu", "model=mlp", "debug=limit", "model.scheduler=null",
         "trainer.precision=bf16-mixed", "trainer.accumulate_grad_batches=2",
         "trainer.gradient_clip_val=0.5", "model.lr_scaling=linear", "data.batch_size=32",
         "callbacks.progress_bar=null", "trainer.limit_test_batches=null"],
        tmp_path, timeout=400,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    # Two processes joined one gloo process group.
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in out and "GLOBAL_RANK: 1, MEMBER: 2/2" in out
    assert "Using bfloat16 Automatic Mixed Precision" in out
    (run,) = run_dirs(tmp_path)  # one run dir for both ranks
    assert {"checkpoints", "metrics.json"} <= {p.name for p in run.iterdir()}
    events = list(run.glob("events.out.tfevents.*"))
    assert events and len({e.name.split(".")[-2] for e in events}) == 1  # one writer process
    assert not list(run.glob("version_*"))
    # Effective batch = 32 x 2 (accumulation) x 2 (processes): the world size reached the model.
    assert session_hparams(run)["effective_batch_size"] == 128
    # The test accuracy is over the whole test split (both ranks' halves), not rank 0's half.
    metrics = final_metrics(run)
    ckpt = sorted((run / "checkpoints").glob("epoch*.ckpt"))[0]
    expected = full_split_accuracy(str(ckpt), "test", torch.bfloat16)
    # DistributedSampler pads an odd split with one repeated sample: allow one sample's worth.
    assert metrics["test/acc"] == pytest.approx(expected, abs=1 / 300)


@pytest.mark.slow
def test_ddp_cpu_plain_run(tmp_path: Path) -> None:
    proc = run_cli(["train.py", "trainer=ddp_cpu", "model=mlp", "debug=limit"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = run_dirs(tmp_path)
    assert 0.0 <= final_metrics(run)["test/acc"] <= 1.0


def test_replica_outputs_reduce_to_one() -> None:
    gathered = {"loss": torch.tensor([1.0, 3.0]), "n": torch.tensor([4.0, 4.0]), "tag": "x"}
    reduced = reduce_replica_outputs(gathered)
    assert reduced["loss"].shape == () and reduced["loss"].item() == 2.0
    assert reduced["n"].item() == 4.0 and reduced["tag"] == "x"
    assert reduce_replica_outputs(torch.tensor(5.0)).item() == 5.0  # single device: unchanged


def test_batches_go_to_the_root_device() -> None:
    strategy = DataParallelStrategy(parallel_devices=[torch.device("cpu")])
    assert strategy.root_device == torch.device("cpu")
    batch = (torch.zeros(4, 2), torch.ones(4))
    # Whatever device is asked for, DataParallel scatters from the root one.
    moved = strategy.batch_to_device(batch, device=torch.device("meta"))
    assert all(t.device == torch.device("cpu") for t in moved)


class Logs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
        self.logged: list[str] = []

    def log(self, name: str, *args, **kwargs) -> None:
        self.logged.append(name)

    def log_dict(self, *args, **kwargs) -> None:
        self.logged.append("dict")

    def training_step(self, x: torch.Tensor) -> torch.Tensor:
        self.log("train/loss")
        return (self.w * x).sum()


def test_only_the_root_replica_logs() -> None:
    root = Logs()
    assert _ReplicaStep(root, torch.device("cpu"))(torch.ones(2)).item() == 2.0
    assert root.logged == ["train/loss"]
    # A replica on another device than the root runs the step but does not log.
    other = Logs()
    assert _ReplicaStep(other, torch.device("cuda", 0))(torch.ones(2)).item() == 2.0
    assert other.logged == []


def test_dp_on_cpu_says_so_and_trains(tmp_path: Path, caplog) -> None:
    from fasttrain.tasks import train

    cfg = compose_train(tmp_path, "trainer=dp", "trainer.accelerator=cpu")
    with caplog.at_level(logging.INFO):
        metrics = train(cfg)
    said = [r.getMessage() for r in caplog.records if "needs 2 or more GPUs" in r.getMessage()]
    assert len(said) == 1
    assert 0.0 <= metrics["test/acc"] <= 1.0


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a CUDA device")
def test_ddp_and_dp_configs_build_on_gpu(tmp_path: Path) -> None:
    from fasttrain.assemble import build

    for name in ("ddp", "dp", "fsdp"):
        cfg = compose_train(tmp_path, f"trainer={name}", "trainer.devices=1")
        trainer = build(cfg.trainer, "trainer", logger=False)
        assert trainer.strategy.root_device.type == "cuda"
