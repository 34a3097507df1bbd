"""Speed overrides take effect: model.channels_last, model.compile, data.device_prefetch,
matmul_precision, trainer.benchmark; and bad practice overrides fail before any training."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from practices import build_run, compose_train

from conftest import run_cli, run_dirs
from fasttrain.config.errors import UserError

CPU = ["trainer.accelerator=cpu", "trainer.devices=1"]


class InputFormat(torch.nn.Module):
    """Wraps a net and records whether its 4-D input arrived in channels_last layout."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net, self.seen = net, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(x.is_contiguous(memory_format=torch.channels_last))
        return self.net(x)


def test_channels_last_converts_net_and_inputs(tmp_path: Path) -> None:
    cfg = compose_train(tmp_path, *CPU, "model=cnn", "model.scheduler=null",
                        "model.channels_last=true", "model.net.channels=[8]",
                        "trainer.limit_train_batches=2", "data.batch_size=16")  # fmt: skip
    trainer, model, datamodule = build_run(cfg)
    conv = model.net.features[3].weight  # [8, 8, 3, 3] (with 1 channel both layouts coincide)
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    model.net = InputFormat(model.net)
    trainer.fit(model, datamodule=datamodule)
    assert trainer.global_step == 2 and model.net.seen and all(model.net.seen)


def test_compile_compiles_the_net_not_the_module(tmp_path: Path) -> None:
    from fasttrain.assemble import build

    model = build(compose_train(tmp_path, "model.compile=true").model, "model")
    assert model.net._compiled_call_impl is not None  # nn.Module.compile(): in place
    assert getattr(model, "_compiled_call_impl", None) is None
    # Checkpoints keep the plain net's parameter names.
    assert not any("_orig_mod" in k for k in model.state_dict())


@pytest.mark.slow
def test_compiled_run_completes(tmp_path: Path) -> None:
    cfg = compose_train(tmp_path, *CPU, "model.compile=true", "model.net.hidden=[16]")
    trainer, model, datamodule = build_run(cfg)
    trainer.fit(model, datamodule=datamodule)
    assert trainer.global_step == 4 and model.net._compiled_call_impl is not None


def test_device_prefetch_is_a_noop_with_one_line_on_cpu(tmp_path: Path, caplog) -> None:
    cfg = compose_train(tmp_path, *CPU, "data.device_prefetch=true")
    trainer, model, datamodule = build_run(cfg)
    with caplog.at_level(logging.INFO):
        trainer.fit(model, datamodule=datamodule)
    said = [r.getMessage() for r in caplog.records if "device_prefetch" in r.getMessage()]
    assert len(said) == 1 and "no-op" in said[0]
    assert trainer.global_step == 4


def test_prefetch_loader_survives_lightning_recreating_it() -> None:
    # Under DDP Lightning re-creates the loader with a DistributedSampler; prefetch_to must stay.
    from lightning.fabric.utilities.data import _replace_dunder_methods
    from lightning.pytorch.utilities.data import _update_dataloader
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    from fasttrain.data.prefetch import PrefetchDataLoader

    data = TensorDataset(torch.arange(8.0))
    with _replace_dunder_methods(DataLoader, "dataset"):
        loader = PrefetchDataLoader(data, batch_size=2, prefetch_to="cuda:0")
    sampler = DistributedSampler(data, num_replicas=2, rank=0, shuffle=False)
    again = _update_dataloader(loader, sampler)
    assert type(again) is PrefetchDataLoader and again.prefetch_to == "cuda:0"
    assert again.sampler is sampler


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_prefetch_delivers_batches_on_the_gpu() -> None:
    from torch.utils.data import TensorDataset

    from fasttrain.data.prefetch import PrefetchDataLoader

    data = TensorDataset(torch.arange(64.0).reshape(32, 2))
    loader = PrefetchDataLoader(data, batch_size=4, pin_memory=True, prefetch_to="cuda:0")
    batches = [b for (b,) in loader]
    assert all(b.is_cuda for b in batches)
    assert torch.equal(torch.cat(batches).cpu(), data.tensors[0])


def test_matmul_precision_and_benchmark_are_applied(tmp_path: Path) -> None:
    from fasttrain.fit import set_matmul_precision

    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark
    try:
        set_matmul_precision("medium")
        assert torch.get_float32_matmul_precision() == "medium"
        build_run(compose_train(tmp_path, *CPU, "trainer.benchmark=true"))
        assert torch.backends.cudnn.benchmark is True
    finally:
        torch.set_float32_matmul_precision(before[0])
        torch.backends.cudnn.benchmark = before[1]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("trainer.precision=17", "trainer.precision=17: expected one of"),
        ("trainer.strategy=foo", "trainer.strategy='foo': expected one of auto, "),
        ("trainer.gradient_clip_algorithm=foo",
         "trainer.gradient_clip_algorithm='foo': expected one of 'norm', 'value'"),
        ("model.lr_scaling=cubic",
         "model.lr_scaling='cubic': expected one of 'none', 'linear', 'sqrt'"),
        ("trainer.accumulate_grad_batches=0",
         "trainer.accumulate_grad_batches=0: expected an int >= 1"),
        ("trainer.gradient_clip_val=-1", "trainer.gradient_clip_val=-1: expected a number >= 0"),
        ("matmul_precision=low",
         "matmul_precision='low': expected one of 'highest', 'high', 'medium' or null"),
        ("tuner.batch_size=double",
         "tuner.batch_size='double': expected one of 'power', 'binsearch' or null"),
        ("tuner.lr_find=3", "tuner.lr_find=3: expected true or false"),
    ],
)  # fmt: skip
def test_bad_practice_override_fails_before_training(
    tmp_path: Path, override: str, message: str
) -> None:
    from fasttrain.tasks import train

    cfg = compose_train(tmp_path, override)
    with pytest.raises(UserError) as err:
        train(cfg)
    assert message in str(err.value)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run" / "metrics.json").exists()


@pytest.mark.slow
def test_bad_override_on_the_command_line_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    proc = run_cli(["train.py", "trainer.gradient_clip_algorithm=foo"], tmp_path)
    assert proc.returncode == 2
    assert "trainer.gradient_clip_algorithm='foo': expected one of 'norm', 'value'" in proc.stderr
    assert run_dirs(tmp_path) == []
