"""The CUDA paths of the practices, on a real GPU (bench/gpu_check.sh runs these; they skip here).

Each mirrors a CPU test that proves the same override on CPU: precision (test_precision.py),
speed flags (test_speed_flags.py), OOM fallback (test_oom.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from practices import build_run, compose_train, seen_in_training

from fasttrain import fit
from fasttrain.models.nets import MLP

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
GPU = ["trainer.accelerator=gpu", "trainer.devices=1"]


class Recorder(MLP):
    """An MLP that records, inside forward, what autocast and the parameters look like there."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[bool, torch.dtype, torch.dtype, str]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = next(self.parameters())
        autocast = torch.is_autocast_enabled("cuda")
        self.seen.append((autocast, torch.get_autocast_dtype("cuda"), p.dtype, p.device.type))
        return super().forward(x)


@pytest.mark.parametrize(
    ("precision", "autocast_dtype"), [("16-mixed", torch.float16), ("bf16-mixed", torch.bfloat16)]
)
def test_mixed_precision_runs_under_cuda_autocast(
    tmp_path: Path, precision, autocast_dtype
) -> None:
    cfg = compose_train(tmp_path, *GPU, f"trainer.precision={precision}")
    net = Recorder([1, 8, 8], 10, hidden=[32])
    trainer, model, datamodule = build_run(cfg, net=net)
    trainer.fit(model, datamodule=datamodule)
    assert net.seen and all(s == (True, autocast_dtype, torch.float32, "cuda") for s in net.seen)
    scaler = getattr(trainer.precision_plugin, "scaler", None)
    if precision == "16-mixed":
        # fp16 needs loss scaling: the GradScaler ran and kept a finite, positive scale
        assert scaler is not None and 0 < scaler.get_scale() < float("inf")
    else:
        assert scaler is None  # bf16 has fp32's range: no scaler
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_channels_last_and_compile_on_cuda(tmp_path: Path) -> None:
    cfg = compose_train(
        tmp_path, *GPU, "model/net=small_cnn", "model.channels_last=true", "model.compile=true",
        "trainer.precision=bf16-mixed",
    )  # fmt: skip

    def first_conv(trainer, model) -> tuple[bool, bool]:
        conv = next(m for m in model.net.modules() if isinstance(m, torch.nn.Conv2d))
        return conv.weight.is_cuda, conv.weight.is_contiguous(memory_format=torch.channels_last)

    watch = seen_in_training(first_conv)
    trainer, model, datamodule = build_run(cfg, [watch])
    trainer.fit(model, datamodule=datamodule)
    assert watch.seen == (True, True)  # on the GPU, channels_last, while it trained
    assert model.net._compiled_call_impl is not None  # nn.Module.compile() in place
    assert trainer.global_step == 4


class AllocatesPerSample(MLP):
    """Allocates `mib` MiB of CUDA memory per sample in forward: a real allocator OOM above the
    batch size the free memory allows."""

    def __init__(self, *args, mib: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.mib, self.sizes = mib, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.empty(x.shape[0], self.mib, 2**20, dtype=torch.uint8, device=x.device)
        self.sizes.append(x.shape[0])
        del scratch
        return super().forward(x)


def test_oom_fallback_on_a_real_cuda_oom(tmp_path: Path) -> None:
    free, _ = torch.cuda.mem_get_info()
    per_sample = 2**20 * 1024  # 1 GiB a sample
    fits = int(free * 0.8) // per_sample  # what surely fits, with room for the model
    batch = 1 << (2 * max(fits, 1)).bit_length()  # the power of two >= 2x what fits: it OOMs
    cfg = compose_train(tmp_path, *GPU, f"data.batch_size={batch}", "data=synthetic",
                        "data.input_shape=[1,8,8]", f"data.num_samples={4 * batch}")  # fmt: skip
    net = AllocatesPerSample([1, 8, 8], 10, hidden=[16], mib=1024)
    trainer, model, datamodule = build_run(cfg, net=net)
    fit.fit(trainer, model, datamodule, oom_fallback=True)
    ran = datamodule.batch_size
    assert ran * per_sample < free and ran < batch
    assert trainer.accumulate_grad_batches * ran == batch  # effective batch kept
    assert trainer.global_step > 0
