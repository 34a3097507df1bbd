"""One Exporter per deployment format: write the file from the fp32 net, then load it back.

Every check runs on what `load` reads back from disk, never on the object that was exported, so
a file that does not round-trip fails its check instead of passing it unseen.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

import torch
from torch import nn

from fasttrain.config.errors import UserError
from fasttrain.models.spec import spec_of

Format = Literal["onnx", "torchscript", "int8", "fp16"]
FORMATS: tuple[str, ...] = get_args(Format)
# How a format is judged (see verify.Tolerance): "exact" = same logits up to float rounding,
# "accuracy" = test accuracy close to fp32, "agreement" = same top-1 class almost always.
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
        return module(x.to(device, dtype)).float().cpu()

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

    def write(self, net: nn.Module, example: torch.Tensor, path: Path) -> dict[str, Any]:
        """Write the CPU fp32 `net` (eval mode) to `path`; return facts for the report."""
        raise NotImplementedError

    def load(self, path: Path, device: torch.device) -> tuple[Runner, torch.device]:
        """Read `path` back; the runner and the device it computes on."""
        raise NotImplementedError


class OnnxExporter(Exporter):
    name, filename, criterion = "onnx", "model.onnx", "exact"

    def requires(self) -> list[str]:
        return ["onnx", "onnxruntime", "onnxscript"]

    def write(self, net: nn.Module, example: torch.Tensor, path: Path) -> dict[str, Any]:
        # The torch.export-based ("dynamo") exporter: the default since torch 2.9, where the
        # TorchScript-based one is deprecated; it needs onnxscript. One file (external_data
        # off): protobuf caps it at 2 GB, far above the nets here. The batch axis is dynamic,
        # so one file serves batch 1 and batch 64 (the example batch must have >= 2 samples:
        # torch.export specialises a dimension of size 1).
        with _quiet():
            torch.onnx.export(
                net, (example,), str(path), dynamo=True, external_data=False, verbose=False,
                input_names=["input"], output_names=["logits"],
                dynamic_shapes=({0: torch.export.Dim("batch")},),
            )  # fmt: skip
        return {"opset": _onnx_opset(path)}

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


def _onnx_opset(path: Path) -> int:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(model)  # a structurally invalid graph fails here, by name
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


class TorchScriptExporter(Exporter):
    name, filename, criterion = "torchscript", "model.ts", "exact"

    def write(self, net: nn.Module, example: torch.Tensor, path: Path) -> dict[str, Any]:
        with _quiet():
            try:
                # Scripting keeps Python control flow; tracing records the one path `example`
                # took, which is exact for a feed-forward net and the fallback for code that
                # the TorchScript compiler rejects.
                module, method = torch.jit.script(net), "script"
            except Exception:
                module, method = torch.jit.trace(net, example), "trace"
            torch.jit.save(module, str(path))
        return {"method": method}

    def load(self, path: Path, device: torch.device) -> tuple[Runner, torch.device]:
        with _quiet():
            module = torch.jit.load(str(path), map_location=device)
        return torch_runner(module, device), device


class WeightsExporter(Exporter):
    """A `weights_only` file: {"format", "net": the net's Hydra spec, "state_dict": converted}.

    Like a checkpoint it names code instead of pickling it, so loading runs nothing from the
    file; `convert` is applied to the rebuilt fp32 net before its weights are loaded.
    """

    def convert(self, net: nn.Module) -> nn.Module:
        raise NotImplementedError

    def runner(self, net: nn.Module, device: torch.device) -> tuple[Runner, torch.device]:
        raise NotImplementedError

    def write(self, net: nn.Module, example: torch.Tensor, path: Path) -> dict[str, Any]:
        spec = spec_of(net)
        if spec is None:
            raise UserError(
                f"format={self.name}: {type(net).__name__} does not record its constructor "
                "arguments (net.hparams), so the file could not rebuild it"
            )
        with _quiet():
            converted = self.convert(copy.deepcopy(net))
        torch.save({"format": self.name, "net": spec, "state_dict": converted.state_dict()}, path)
        return {}

    def load(self, path: Path, device: torch.device) -> tuple[Runner, torch.device]:
        from hydra.utils import instantiate

        with _quiet():
            blob = torch.load(path, map_location="cpu", weights_only=True)
            net = self.convert(instantiate(blob["net"]).eval())
        net.load_state_dict(blob["state_dict"])
        return self.runner(net, device)


class Int8Exporter(WeightsExporter):
    name, filename, criterion = "int8", "model_int8.pt", "accuracy"

    def skip_reason(self, net: nn.Module) -> str | None:
        if not any(isinstance(m, nn.Linear) for m in net.modules()):
            return "no Linear layers: dynamic int8 quantisation would leave the net unchanged"
        return None

    def convert(self, net: nn.Module) -> nn.Module:
        # Weights int8 ahead of time, activations quantised per batch at run time; only Linear
        # layers (convolutions need static quantisation with calibration data).
        return torch.ao.quantization.quantize_dynamic(net, {nn.Linear}, dtype=torch.qint8)

    def runner(self, net: nn.Module, device: torch.device) -> tuple[Runner, torch.device]:
        cpu = torch.device("cpu")  # dynamic int8 kernels (fbgemm/qnnpack) exist on CPU only
        return torch_runner(net, cpu), cpu


class Fp16Exporter(WeightsExporter):
    name, filename, criterion = "fp16", "model_fp16.pt", "agreement"

    def convert(self, net: nn.Module) -> nn.Module:
        return net.half()

    def runner(self, net: nn.Module, device: torch.device) -> tuple[Runner, torch.device]:
        if device.type == "cuda":
            return torch_runner(net, device, torch.float16), device
        # CPU fp16 kernels are slow or missing: compute in fp32 from the rounded weights, which
        # still measures what halving the weights costs in accuracy.
        return torch_runner(net.float(), device), device


EXPORTERS: dict[str, Exporter] = {
    e.name: e for e in (OnnxExporter(), TorchScriptExporter(), Int8Exporter(), Fp16Exporter())
}
