"""What a training step costs in FLOPs and what the device could do: the dense-peak table per
matmul dtype, and a model's training FLOPs per sample (its net's own formula, else counted on the
meta device). PerfMonitor turns them into MFU."""

from __future__ import annotations

import re
from itertools import chain
from typing import Any

import torch
from lightning.fabric.utilities.throughput import measure_flops

# Dense (no 2:4 sparsity) Tensor Core peaks in TFLOP/s from NVIDIA's datasheets, per matmul
# dtype. Searched in order in the lower-cased device name (`torch.cuda.get_device_name`), so
# the PCIe/NVL variants come before their family. Lightning 2.6's own table misses
# "NVIDIA H200" and quotes sparse figures, which halves every MFU it reports.
_HOPPER_SXM = {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9}
_HOPPER_NVL = {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}
_AMPERE_A100 = {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}
DENSE_PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    (r"h[12]00 nvl", _HOPPER_NVL),
    (r"h100 pcie", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.2}),
    (r"gh200|h200|h100|h800", _HOPPER_SXM),
    (r"a100|a800", _AMPERE_A100),
    (r"l40s", {"bf16": 362.0, "fp16": 362.0, "tf32": 183.0, "fp32": 91.6}),
    (r"\bl4\b", {"bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3}),
    (r"\ba10\b", {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2}),
    (r"v100.*pcie", {"fp16": 112.0, "fp32": 14.0}),
    (r"v100", {"fp16": 125.0, "fp32": 15.7}),
    (r"\bt4\b", {"fp16": 65.0, "fp32": 8.1}),
)


def matmul_dtype(precision: str) -> str | None:
    """The dtype the matmuls run in under a Lightning precision setting ("bf16-mixed" -> "bf16")."""
    precision = str(precision)
    if precision.startswith("bf16"):
        return "bf16"
    if precision.startswith("16"):
        return "fp16"
    if precision.startswith("32"):
        # float32 matmuls use TF32 Tensor Cores unless the user asked for "highest".
        return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    return None


def dense_peak_tflops(device_name: str, dtype: str | None) -> float | None:
    """Dense peak TFLOP/s of a device for a matmul dtype, or None when the table lacks either."""
    name = device_name.lower()
    for pattern, peaks in DENSE_PEAK_TFLOPS:
        if re.search(pattern, name):
            return peaks.get(dtype) if dtype else None
    return None


def flops_per_sample(module: torch.nn.Module, batch: Any) -> float | None:
    """Training FLOPs (forward + backward) per sample, counted on the meta device.

    The module's parameters and buffers are swapped for meta tensors of the same shapes for one
    call (`functional_call`), so nothing is computed, copied or allocated on the real device and
    no real gradient or running statistic is touched. Input: the batch's first tensor [B, ...].
    """
    x = batch[0] if isinstance(batch, (list, tuple)) else batch
    if not isinstance(x, torch.Tensor) or x.ndim == 0:
        return None
    meta = {
        name: torch.empty_like(t, device="meta", requires_grad=t.requires_grad)
        for name, t in chain(module.named_parameters(), module.named_buffers())
    }
    x_meta = torch.empty_like(x, device="meta")
    flops = measure_flops(
        module,
        lambda: torch.func.functional_call(module, meta, (x_meta,)),
        lambda y: y.sum(),  # the loss itself is negligible; backward is what counts
    )
    return flops / x.shape[0] if flops else None


def tokens_per_sample(module: torch.nn.Module, batch: Any) -> int | None:
    """Tokens per sample of a model of token sequences (its net has `flops_per_token`): the
    batch's sequence length [B, T]. None for other models."""
    net = getattr(module, "net", None)
    x = batch[0] if isinstance(batch, (list, tuple)) else batch
    if not hasattr(net, "flops_per_token") or not isinstance(x, torch.Tensor) or x.ndim != 2:
        return None
    return int(x.shape[1])


def formula_flops(module: torch.nn.Module, batch: Any) -> float | None:
    """Training FLOPs per sample from the net's own formula (`flops_per_token(context)`: 6N plus
    attention, as nanoGPT's estimate_mfu and PaLM count them), or None: then counted."""
    tokens = tokens_per_sample(module, batch)
    if tokens is None:
        return None
    return float(module.net.flops_per_token(tokens) * tokens)  # type: ignore[union-attr,operator]
