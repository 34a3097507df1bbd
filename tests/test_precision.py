"""trainer.precision really changes what runs: autocast inside forward, parameter dtypes, and the
fp16 + GradScaler path (through Lightning's MixedPrecision plugin) on CPU."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from practices import build_run, compose_train

from fasttrain.models.nets import MLP


class AutocastProbe(MLP):
    """An MLP that records, on each call, autocast's state and the dtypes it sees."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[bool, torch.dtype, torch.dtype, torch.dtype]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = next(self.parameters())
        self.seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"),
                          weight.dtype, x.dtype))  # fmt: skip
        return super().forward(x)


def fit_with_probe(tmp_path: Path, *overrides: str, plugins: list | None = None):
    cfg = compose_train(tmp_path, "trainer.accelerator=cpu", "trainer.devices=1", *overrides)
    probe = AutocastProbe([1, 8, 8], 10, hidden=[16])
    trainer, model, datamodule = build_run(cfg, net=probe)
    if plugins:  # a precision plugin instance stands in for the `precision` flag
        from fasttrain.assemble import build

        trainer = build(cfg.trainer, "trainer", logger=False, plugins=plugins, precision=None)
    trainer.fit(model, datamodule=datamodule)
    assert trainer.global_step > 0
    return trainer, probe


def test_bf16_mixed_autocasts_forward(tmp_path: Path) -> None:
    _, probe = fit_with_probe(tmp_path, "trainer.precision=bf16-mixed")
    enabled, dtype, weight, _ = probe.seen[-1]
    assert enabled and dtype == torch.bfloat16
    assert weight == torch.float32  # mixed: fp32 master weights, low-precision compute


def test_32_true_does_not_autocast(tmp_path: Path) -> None:
    _, probe = fit_with_probe(tmp_path, "trainer.precision=32-true")
    assert not any(enabled for enabled, *_ in probe.seen)


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [("bf16-true", torch.bfloat16), ("16-true", torch.float16), ("64-true", torch.float64)],
)
def test_true_precisions_convert_params_and_inputs(
    tmp_path: Path, precision: str, dtype: torch.dtype
) -> None:
    # 16-true refuses Adam's eps=1e-8 (it rounds to 0 in fp16): SGD trains in fp16 weights.
    optimizer = ["model/optimizer=sgd"] if precision == "16-true" else []
    _, probe = fit_with_probe(tmp_path, f"trainer.precision={precision}", *optimizer)
    _, _, weight, x = probe.seen[-1]
    assert weight == dtype and x == dtype


def test_16_mixed_falls_back_to_bf16_on_cpu_with_one_line(tmp_path: Path) -> None:
    cfg = compose_train(tmp_path, "trainer.accelerator=cpu", "trainer.precision=16-mixed")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer, *_ = build_run(cfg)
    said = [str(w.message) for w in caught if "AMP with fp16 is not supported" in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0]
    assert "bf16-mixed" in said[0]
    assert trainer.precision == "bf16-mixed"


def test_fp16_gradscaler_path_runs_on_cpu(tmp_path: Path) -> None:
    from lightning.pytorch.plugins.precision import MixedPrecision

    plugin = MixedPrecision("16-mixed", device="cpu")
    assert isinstance(plugin.scaler, torch.amp.GradScaler)
    trainer, probe = fit_with_probe(tmp_path, plugins=[plugin])
    enabled, dtype, weight, _ = probe.seen[-1]
    assert enabled and dtype == torch.float16 and weight == torch.float32
    assert trainer.precision_plugin is plugin
    # The scaler took part: its scale exists (made lazily on the first scaled loss) and is finite.
    assert plugin.scaler._scale is not None
    assert torch.isfinite(torch.tensor(plugin.scaler.get_scale()))
