"""Environment doctor: do Python, torch, CUDA, the driver and the GPUs fit together?

    python -m fasttrain.doctor          # a table, then each problem with its fix
    python -m fasttrain.doctor --json   # the same as JSON, for scripts and bug reports

Each check is a small function returning plain data; `collect` gathers them, `problems` turns
mismatches into (problem, fix) pairs, and `render` prints. Tests drive the functions directly.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

GB = 1e9
PROC_DRIVER = Path("/proc/driver/nvidia/version")
# Oldest Linux driver each CUDA major release runs on (minor-version compatibility), from
# NVIDIA's CUDA toolkit release notes, table 2.
MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}


def versions() -> dict[str, str | None]:
    """Python and the framework versions; CUDA build, cuDNN and NCCL as torch was built."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    # fasttrain's metadata version: a project's wheel carries its template commit (0.3.0+g<sha>)
    for pkg in ("fasttrain", "torch", "lightning", "hydra-core", "torchmetrics"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    # The imported build's own version: "2.14.1+cu130" tells a CUDA build from "+cpu" (the
    # package metadata drops the suffix).
    out["torch"] = torch.__version__
    out["cuda_build"] = torch.version.cuda  # None: a CPU-only build of torch
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    out["cudnn"] = str(cudnn) if cudnn else None
    try:
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except Exception:  # CPU builds have no NCCL
        out["nccl"] = None
    return out


def nvidia_driver_present() -> bool:
    """An NVIDIA driver is installed, whether or not torch can use it."""
    return PROC_DRIVER.exists() or shutil.which("nvidia-smi") is not None


def parse_driver_version(text: str) -> str | None:
    """`NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ...` -> "550.54.15"."""
    match = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text) or re.search(
        r"^\s*([\d]+\.[\d.]+)\s*$", text, re.MULTILINE
    )
    return match.group(1) if match else None


def driver_version() -> str | None:
    if PROC_DRIVER.exists():
        found = parse_driver_version(PROC_DRIVER.read_text())
        if found:
            return found
    if shutil.which("nvidia-smi"):
        try:
            res = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20,
            )  # fmt: skip
            return parse_driver_version(res.stdout.splitlines()[0]) if res.stdout else None
        except (OSError, subprocess.TimeoutExpired):
            return None
    return None


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def driver_fits(cuda_build: str | None, driver: str | None) -> bool | None:
    """Whether the driver runs the CUDA release torch was built for; None when unknown."""
    if not cuda_build or not driver:
        return None
    needed = MIN_DRIVER.get(_version_tuple(cuda_build)[0])
    return None if needed is None else _version_tuple(driver) >= _version_tuple(needed)


def gpus() -> list[dict[str, Any]]:
    """Each visible CUDA device: name, memory, compute capability and bf16 support."""
    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out.append({
            "index": i, "name": props.name, "memory_gb": round(props.total_memory / GB, 1),
            "compute_capability": f"{props.major}.{props.minor}",
            # bf16 Tensor Cores arrived with Ampere (8.0); older GPUs only emulate bf16, slowly.
            "bf16": props.major >= 8,
        })  # fmt: skip
    return out


def pinned_memory_works() -> bool | None:
    """Whether page-locked host memory can be allocated; None without CUDA (nothing to pin for)."""
    if not torch.cuda.is_available():
        return None
    try:
        torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True)
    except RuntimeError:
        return False
    return True


def h2d_bandwidth(size_mb: int = 256, repeats: int = 5) -> dict[str, float] | None:
    """Best-of-`repeats` host-to-device copy speed in GB/s, pageable vs pinned; None on CPU."""
    if not torch.cuda.is_available():
        return None
    dev = torch.device("cuda")
    device_buf = torch.empty(size_mb << 20, dtype=torch.uint8, device=dev)
    out = {}
    for kind, pin in (("pageable_gbps", False), ("pinned_gbps", True)):
        try:
            host = torch.empty(size_mb << 20, dtype=torch.uint8, pin_memory=pin)
        except RuntimeError:
            continue
        best = float("inf")
        for _ in range(repeats):
            torch.cuda.synchronize(dev)
            start = time.perf_counter()
            device_buf.copy_(host, non_blocking=pin)
            torch.cuda.synchronize(dev)
            best = min(best, time.perf_counter() - start)
        out[kind] = round(host.numel() / best / GB, 1)
    return out


def cpu_info() -> dict[str, int]:
    from fasttrain.data import resolve_num_workers
    from fasttrain.data.base import cpu_count

    return {"cpus": cpu_count(), "num_workers_auto": resolve_num_workers("auto")}


def collect() -> dict[str, Any]:
    """Every check, as one JSON-ready dict."""
    info = versions()
    driver = driver_version()
    return {
        "versions": info,
        "driver_present": nvidia_driver_present(),
        "driver": driver,
        "driver_fits_cuda_build": driver_fits(info["cuda_build"], driver),
        "cuda_available": torch.cuda.is_available(),
        "gpus": gpus(),
        "pinned_memory": pinned_memory_works(),
        "h2d_bandwidth": h2d_bandwidth(),
        **cpu_info(),
    }


def problems(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(problem, fix) for each mismatch found in a `collect()` report."""
    found = []
    build = report["versions"]["cuda_build"]
    if report["driver_present"] and build is None:
        found.append((
            "torch is a CPU-only build but this machine has an NVIDIA driver",
            "install the CUDA build of torch that fits the driver (pytorch.org/get-started), "
            "e.g. pip install torch --index-url https://download.pytorch.org/whl/cu128",
        ))  # fmt: skip
    if report["driver_fits_cuda_build"] is False:
        need = MIN_DRIVER[_version_tuple(build)[0]]
        found.append((
            f"driver {report['driver']} is too old for torch's CUDA {build} (needs >= {need})",
            "update the NVIDIA driver, or install a torch build for an older CUDA release",
        ))  # fmt: skip
    elif build and report["driver_present"] and not report["cuda_available"]:
        found.append((
            f"torch was built for CUDA {build} but cannot use the GPU",
            "check the driver with nvidia-smi and that CUDA_VISIBLE_DEVICES is not empty",
        ))  # fmt: skip
    for gpu in report["gpus"]:
        if not gpu["bf16"]:
            found.append((
                f"GPU {gpu['index']} ({gpu['name']}) has no bf16 Tensor Cores",
                "use trainer.precision=16-mixed (fp16 with a GradScaler) instead of bf16-mixed",
            ))  # fmt: skip
    if report["pinned_memory"] is False:
        found.append((
            "pinned (page-locked) host memory cannot be allocated",
            "set data.pin_memory=false, or raise the locked-memory limit (ulimit -l)",
        ))  # fmt: skip
    return found


def render(report: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console(soft_wrap=True)
    table = Table(title="fasttrain doctor", title_justify="left", show_header=False)
    table.add_column("check", style="bold")
    table.add_column("value")
    for name, value in report["versions"].items():
        table.add_row(name, value or "-")
    table.add_row(
        "NVIDIA driver", report["driver"] or ("present" if report["driver_present"] else "-")
    )
    fits = report["driver_fits_cuda_build"]
    table.add_row("driver fits CUDA build", "-" if fits is None else ("yes" if fits else "NO"))
    for gpu in report["gpus"]:
        table.add_row(
            f"GPU {gpu['index']}",
            f"{gpu['name']}, {gpu['memory_gb']} GB, compute {gpu['compute_capability']}, "
            f"bf16 {'yes' if gpu['bf16'] else 'no'}",
        )
    pinned = report["pinned_memory"]
    table.add_row("pinned memory", "-" if pinned is None else ("works" if pinned else "FAILS"))
    for kind, gbps in (report["h2d_bandwidth"] or {}).items():
        table.add_row(f"host->GPU {kind.split('_')[0]}", f"{gbps} GB/s")
    table.add_row("CPUs", str(report["cpus"]))
    table.add_row("num_workers (auto)", str(report["num_workers_auto"]))
    console.print(table)
    if not report["gpus"]:
        console.print("No GPU found: training runs on the CPU.")
    for problem, fix in problems(report):
        console.print(f"[yellow]warning:[/] {problem}\n  fix: {fix}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fasttrain.doctor",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    report = collect()
    if args.json:
        report["problems"] = [{"problem": p, "fix": f} for p, f in problems(report)]
        print(json.dumps(report, indent=2))
    else:
        render(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
