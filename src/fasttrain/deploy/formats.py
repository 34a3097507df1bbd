"""One Exporter per deployment format: write the file from the fp32 net, then load it back.

Every check runs on what `load` reads back from disk, never on the object that was exported, so
a file that does not round-trip fails its check instead of passing it unseen. Every file loads
with its runtime alone (onnxruntime, or torch.jit.load for the other three): no fasttrain code,
no rebuilding step. `metadata` (the input the file takes) goes into the file: ONNX
metadata_props, or the TorchScript extra file `fasttrain.json`.
"""

from __future__ import annotations

import copy
import json
import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import torch
from torch import nn

Format = Literal["onnx", "torchscript", "int8", "fp16"]
FORMATS: tuple[str, ...] = get_args(Format)
# How a format is judged (see verify.Tolerance): "exact" = same logits up to float rounding,
# "accuracy" = the task's test score (accuracy, R^2) close to fp32's, "agreement" = the same
# answer (top-1 class; a value within 1% of the target's std) almost always.
Criterion = Literal["exact", "accuracy", "agreement"]
# A loaded model: CPU float32 inputs [B, *input_shape] -> CPU float32 logits [B, num_classes].
# Host<->device copies are inside, so latencies compare what a caller of each format waits for.
Runner = Callable[[torch.Tensor], torch.Tensor]


def torch_runner(
    module: nn.Module, device: torch.device, dtype: torch.dtype = torch.float32
) -> Runner:
    module = module.to(device).eval()

    @torch.inference_mode()
    def run(x: torch.Tensor) -> torch.Tensor:
        # Features in `dtype`; integer inputs (token ids) keep their type.
        x = x.to(device, dtype) if x.is_floating_point() else x.to(device)
        return module(x).float().cpu()

    return run


@contextmanager
def _quiet() -> Iterator[None]:
    """Silence torch's warnings about its own legacy APIs, and the exporters' INFO logs.

    torch marks torch.jit and torch.ao.quantization deprecated (successors: torch.export and
    torchao), yet TorchScript is what LibTorch and Triton serve, and dynamic int8 needs no
    extra package; both are deliberate here, and the warnings give the user nothing to act on.
    """
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnx_ir", "onnxscript")]
    levels = [log.level for log in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.filterwarnings("ignore", message=r"(?s).*quantized tensor creation")
        warnings.filterwarnings("ignore", message="TypedStorage is deprecated")
        for log in loggers:
            # Hydra logs INFO to the console; the ONNX passes report every graph rewrite there,
            # and torch.onnx warns about torchvision ops even for nets that use none.
            log.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for log, level in zip(loggers, levels, strict=True):
                log.setLevel(level)


METADATA_FILE = "fasttrain.json"  # torch.jit.load(path, _extra_files={METADATA_FILE: ""})


class Standardize(nn.Module):
    """(x - mean) / std, the data module's preprocessing, as the first layer of an export:
    the file then takes raw inputs. mean and std broadcast to x [B, *input_shape]."""

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mean", mean.float())
        self.register_buffer("std", std.float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Buffers, typed Tensor | Module by nn.Module; a class annotation would make the
        # TorchScript compiler fail on its string form (postponed annotations) and fall back to
        # tracing.
        return (x - self.mean) / self.std  # type: ignore[operator]


class Exporter:
    """A deployment format. Subclasses set the class attributes and implement write/load."""

    name: ClassVar[Format]
    filename: ClassVar[str]
    criterion: ClassVar[Criterion]

    def requires(self) -> list[str]:
        """Python modules this format needs beyond the core dependencies."""
        return []

    def skip_reason(self, net: nn.Module) -> str | None:
        """Why exporting `net` in this format would be pointless, or None."""
        return None

    def write(
        self, net: nn.Module, example: torch.Tensor, path: Path, metadata: dict[str, str]
    ) -> dict[str, Any]:
        """Write the CPU fp32 `net` (eval mode) to `path` with `metadata`; return facts for the
        report."""
        raise NotImplementedError

    def load(self, path: Path, device: torch.device) -> tuple[Runner, torch.device]:
        """Read `path` back; the runner and the device it computes on."""
        raise NotImplementedError


class OnnxExporter(Exporter):
    name, filename, criterion = "onnx", "model.onnx", "exact"

    def requires(self) -> list[str]:
        return ["onnx", "onnxruntime", "onnxscript"]

    def write(
        self, net: nn.Module, example: torch.Tensor, path: Path, metadata: dict[str, str]
    ) -> dict[str, Any]:
        # The torch.export-based ("dynamo") exporter: the default since torch 2.9, where the
        # TorchScript-based one is deprecated; it needs onnxscript. One file (external_data
        # off): protobuf caps it at 2 GB, far above the nets here. The batch axis is dynamic,
        # so one file serves batch 1 and batch 64 (the example batch must have >= 2 samples:
        # torch.export specialises a dimension of size 1).
        with _quiet():
            torch.onnx.export(
                net, (example,), str(path), dynamo=True, external_data=False, verbose=False,
                input_names=["input"], output_names=["logits"],
                dynamic_shapes=(dynamic_dims(net),),
            )  # fmt: skip
        return {"opset": _onnx_opset(path, metadata)}

    def load(self, path: Path, device: torch.device) -> tuple[Runner, torch.device]:
        import onnxruntime as ort

        # The CPU provider ships with every onnxruntime wheel; GPU providers need another one.
        options = ort.SessionOptions()
        # As many threads as torch uses, so latencies compare formats, not thread counts.
        options.intra_op_num_threads = torch.get_num_threads()
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

        def run(x: torch.Tensor) -> torch.Tensor:
            return torch.from_numpy(session.run(["logits"], {"input": x.numpy()})[0])

        return run, torch.device("cpu")


def dynamic_dims(net: nn.Module) -> dict[int, Any]:
    """The input axes a file takes at any size: the batch, plus those the net names in
    `dynamic_axes` ({axis: (name, max)}: a language model's sequence length, up to its
    context)."""
    axes = getattr(net, "dynamic_axes", {0: ("batch", None)})
    return {
        axis: torch.export.Dim(name, max=limit) if limit else torch.export.Dim(name)
        for axis, (name, limit) in axes.items()
    }


def _onnx_opset(path: Path, metadata: dict[str, str]) -> int:
    """Check the written graph, add `metadata` to it (onnxruntime: session.get_modelmeta()
    .custom_metadata_map), and return its opset."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(model)  # a structurally invalid graph fails here, by name
    if metadata:
        onnx.helper.set_model_props(model, metadata)
        onnx.save(model, str(path))
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


class TorchScriptFile(Exporter):
    """Written with torch.jit.save, read with torch.jit.load: torch alone runs the file."""

    def write(
        self, net: nn.Module, example: torch.Tensor, path: Path, metadata: dict[str, str]
    ) -> dict[str, Any]:
        with _quiet():
            try:
                # Scripting keeps Python control flow; tracing records the one path `example`
                # took, which is exact for a feed-forward net and the fallback for code that
                # the TorchScript compiler rejects.
                module, method = torch.jit.script(net), "script"
            except Exception:
                module, method = torch.jit.trace(net, example), "trace"
            extra = {METADATA_FILE: json.dumps(metadata)} if metadata else {}
            torch.jit.save(module, str(path), _extra_files=extra)
        return {"method": method}

    def load(self, path: Path, device: torch.device) -> tuple[Runner, torch.device]:
        with _quiet():
            module = torch.jit.load(str(path), map_location=device)
        return torch_runner(module, device), device


class TorchScriptExporter(TorchScriptFile):
    name, filename, criterion = "torchscript", "model.ts", "exact"


class Int8Exporter(TorchScriptFile):
    """Dynamic int8 as TorchScript: torch.jit.load alone runs it, nothing to rebuild or convert."""

    name, filename, criterion = "int8", "model_int8.pt", "accuracy"

    def skip_reason(self, net: nn.Module) -> str | None:
        if not any(isinstance(m, nn.Linear) for m in net.modules()):
            return "no Linear layers: dynamic int8 quantisation would leave the net unchanged"
        return None

    def write(
        self, net: nn.Module, example: torch.Tensor, path: Path, metadata: dict[str, str]
    ) -> dict[str, Any]:
        # Weights int8 ahead of time, activations quantised per batch at run time; only Linear
        # layers (convolutions need static quantisation with calibration data).
        with _quiet():
            quantized = torch.ao.quantization.quantize_dynamic(
                copy.deepcopy(net), {nn.Linear}, dtype=torch.qint8
            )
        return super().write(quantized, example, path, metadata)

    def load(self, path: Path, device: torch.device) -> tuple[Runner, torch.device]:
        cpu = torch.device("cpu")  # dynamic int8 kernels (fbgemm/qnnpack) exist on CPU only
        return super().load(path, cpu)


class HalfPrecision(nn.Module):
    """fp16 weights behind an fp32 interface: float32 inputs in, float32 logits out."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net.half()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Token ids (a language model) stay integers; features go in as fp16.
        return self.net(x.half() if x.is_floating_point() else x).float()


def half_precision(net: nn.Module) -> nn.Module:
    """`net` with fp16 weights; a leading Standardize stays fp32, since raw features can be large
    (1e3 and more) for fp16's 11-bit mantissa."""
    net = copy.deepcopy(net)
    if isinstance(net, nn.Sequential) and isinstance(net[0], Standardize):
        return nn.Sequential(net[0], HalfPrecision(net[1:]))
    return HalfPrecision(net)


class Fp16Exporter(TorchScriptFile):
    """fp16 weights as TorchScript, taking and returning float32 (the cast is in the file)."""

    name, filename, criterion = "fp16", "model_fp16.pt", "agreement"

    def write(
        self, net: nn.Module, example: torch.Tensor, path: Path, metadata: dict[str, str]
    ) -> dict[str, Any]:
        return super().write(half_precision(net), example, path, metadata)


EXPORTERS: dict[str, Exporter] = {
    e.name: e for e in (OnnxExporter(), TorchScriptExporter(), Int8Exporter(), Fp16Exporter())
}
