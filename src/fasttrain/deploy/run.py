"""Export a net in each requested format, read every file back, check it, and report."""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from fasttrain.config.domains import check_arguments
from fasttrain.config.errors import ConfigError, UserError
from fasttrain.deploy.formats import EXPORTERS, Exporter, Format, torch_runner
from fasttrain.deploy.verify import OutputChecks, Tolerance, print_report, verify, write_report

REPORT_NAME = "export_report.json"
DIGEST_KEY = "checkpoint_sha256"  # which weights the report's rows describe


def missing_modules(exporters: Iterable[Exporter]) -> list[str]:
    return [m for e in exporters for m in e.requires() if importlib.util.find_spec(m) is None]


def select(format: Format | Literal["all"]) -> list[Exporter]:
    """`format=` -> exporters; one clear error for an unknown name or a missing extra."""
    check_arguments(select, locals())
    exporters = list(EXPORTERS.values()) if format == "all" else [EXPORTERS[format]]
    missing = missing_modules(exporters)
    if missing:
        raise UserError(
            f"format={format}: needs {', '.join(missing)}; install the export extra: "
            "pip install -e '.[export]'"
        )
    return exporters


def resolve_device(device: Literal["auto", "cpu", "cuda"]) -> torch.device:
    """`device=` auto | cpu | cuda -> torch.device; auto picks CUDA when there is one."""
    check_arguments(resolve_device, locals())
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError("device=cuda: no CUDA device is visible; use device=cpu or device=auto")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def failures(report: dict[str, Any]) -> list[str]:
    """One line per format that missed its target."""
    score = report.get("score", "accuracy")
    return [f"{name}: {row['target']} not met (max abs diff {row['max_abs_diff']:.2e}, "
            f"agreement {row['agreement']:.2%}, {score} {row[score]:.4g})"
            for name, row in report["formats"].items() if row.get("passed") is False]  # fmt: skip


def run_dir_of(ckpt_path: str | Path) -> Path:
    """The run a checkpoint belongs to: <run>/checkpoints/x.ckpt -> <run>; else its folder."""
    ckpt = Path(ckpt_path).resolve()
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent


def checkpoint_digest(source: str | None) -> str | None:
    """The sha256 of the checkpoint file, or None when `source` names no file. A path alone does
    not say which weights: last.ckpt holds newer ones after the run is resumed."""
    if source is None or not Path(source).is_file():
        return None
    digest = hashlib.sha256()
    with open(source, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def merged(out_dir: Path, source: str | None, rows: dict[str, Any],
           digest: str | None = None) -> dict[str, Any]:  # fmt: skip
    """`rows` after the rows of formats an earlier export of the same checkpoint (the same path
    and, when given, the same `digest`) left in `out_dir` (their files still there), so
    `format=onnx` then `format=int8` report both."""
    try:
        earlier = json.loads((out_dir / REPORT_NAME).read_text())
    except (OSError, ValueError):
        return rows
    if not isinstance(earlier, dict) or earlier.get("checkpoint") != source:
        return rows  # another checkpoint's files: its rows describe other weights
    if digest is not None and earlier.get(DIGEST_KEY) != digest:
        return rows  # the same path, other weights (or a report that did not record them)
    kept = {
        name: row
        for name, row in earlier.get("formats", {}).items()
        if name in EXPORTERS and name not in rows and (out_dir / EXPORTERS[name].filename).is_file()
    }
    order = ["eager", *EXPORTERS]
    return dict(sorted({**kept, **rows}.items(), key=lambda item: order.index(item[0])))


def param_bytes(net: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*net.parameters(), *net.buffers()))


def export_and_verify(
    net: nn.Module,
    checks: OutputChecks,
    exporters: Sequence[Exporter],
    example: torch.Tensor,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    out_dir: Path,
    device: torch.device,
    tolerance: Tolerance,
    latency_time: float = 0.2,
    source: str | None = None,
    metadata: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Write each format into `out_dir` (atomically), check what reads back, write the report.

    `net` is the fp32 net in eval mode (with its preprocessing and output layer:
    fasttrain.deploy.inputs); `checks` the task, which says how outputs compare;
    `example` a CPU batch of >= 2 inputs; `batches` the held-out (x, y) split the checks run on,
    as `net` takes it; `metadata` what the files take, written into each and into the report.
    Returns the report (also in export_report.json, merged with the rows of formats exported
    earlier from the same checkpoint into `out_dir`).
    """
    # Before any file is written: torch's Timer times each figure for at least this long, so
    # inf (which `> 0` lets through) would never return.
    if not 0 < latency_time < math.inf:
        raise ConfigError("latency_time", latency_time, "expected a finite number of seconds > 0")
    digest = checkpoint_digest(source)  # now, the nearest to when the weights were read
    net = copy.deepcopy(net).cpu().eval()
    rows: dict[str, dict[str, Any]] = {"eager": {"file": None, "size_bytes": param_bytes(net)}}
    candidates = {"eager": (torch_runner(copy.deepcopy(net), device), device)}
    # Each file is written and checked under a hidden name, and moved into place only with
    # its report: a Ctrl-C or a crash on the way leaves the folder as it was (an older file and
    # the report that vouches for it included), never a file no check has read.
    staged: dict[Path, Path] = {}
    created = not out_dir.exists()
    try:
        for exporter in exporters:
            reason = exporter.skip_reason(net)
            if reason:
                rows[exporter.name] = {"skipped": reason}
                continue
            path = out_dir / exporter.filename
            path.parent.mkdir(parents=True, exist_ok=True)
            staged[path] = tmp = path.with_name(f".{path.name}.{os.getpid()}.unchecked")
            info = exporter.write(net, example, tmp, metadata or {})
            rows[exporter.name] = {"file": exporter.filename, "size_bytes": tmp.stat().st_size,
                                   **info}  # fmt: skip
            candidates[exporter.name] = exporter.load(tmp, device)
        results = verify(net, checks, candidates, batches, latency_time)
        score = checks.score()[0]
        fp32_score = results["eager"][score]
        for name, result in results.items():
            rows[name].update(result)
            if name in EXPORTERS:
                criterion = EXPORTERS[name].criterion
                passed, target = tolerance.judge(criterion, rows[name], fp32_score, score)
                rows[name].update(passed=passed, target=target)
        report = {
            "checkpoint": source, DIGEST_KEY: digest, "output_dir": str(out_dir),
            "device": str(device), "test_samples": results["eager"]["samples"], "score": score,
            "input": metadata or {}, "formats": merged(out_dir, source, rows, digest),
        }  # fmt: skip
        for path, tmp in staged.items():
            os.replace(tmp, path)
        write_report(out_dir / REPORT_NAME, report)
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()
    print_report(report)
    return report
