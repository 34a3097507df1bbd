"""The environment doctor: runs on a CPU machine in both forms, and names each mismatch's fix."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from fasttrain.data import resolve_num_workers
from fasttrain.tools import doctor


def cpu_report(**changes: object) -> dict:
    """A `collect()` report of a CPU machine, with `changes` applied."""
    report = {
        "versions": {"cuda_build": None}, "driver_present": False, "driver": None,
        "driver_fits_cuda_build": None, "cuda_available": False, "gpus": [],
        "pinned_memory": None, "h2d_bandwidth": None, "cpus": 2, "num_workers_auto": 1,
    }  # fmt: skip
    report.update(changes)
    return report


def test_doctor_table_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("the CPU form; the GPU form is test_doctor_on_cuda")
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert "No GPU found: training runs on the CPU." in out
    assert torch.__version__ in out
    assert re.search(rf"num_workers \(auto\)\s+│ {resolve_num_workers('auto')}\b", out)


@pytest.mark.slow  # a process start (~10 s): CI runs it in make test-slow
def test_doctor_json_as_a_command() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # a CPU run, even on a GPU machine
    res = subprocess.run(
        [sys.executable, "-m", "fasttrain.doctor", "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    report = json.loads(res.stdout)
    assert report["versions"]["torch"] == torch.__version__
    assert report["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert report["cuda_available"] is False and report["gpus"] == []
    assert report["h2d_bandwidth"] is None and report["pinned_memory"] is None
    assert report["num_workers_auto"] == resolve_num_workers("auto")
    if not doctor.nvidia_driver_present():
        assert report["problems"] == []


def test_each_mismatch_comes_with_its_fix() -> None:
    assert doctor.problems(cpu_report()) == []
    # CPU-only torch on a machine with an NVIDIA driver
    ((problem, fix),) = doctor.problems(cpu_report(driver_present=True, driver="550.54.15"))
    assert "CPU-only build" in problem and "download.pytorch.org/whl/cu" in fix
    # a driver older than torch's CUDA release needs
    old = cpu_report(
        versions={"cuda_build": "12.8"}, driver_present=True, driver="470.82.01",
        driver_fits_cuda_build=doctor.driver_fits("12.8", "470.82.01"),
    )  # fmt: skip
    ((problem, fix),) = doctor.problems(old)
    assert "470.82.01 is too old for torch's CUDA 12.8 (needs >= 525.60.13)" in problem
    assert "update the NVIDIA driver" in fix
    # a GPU without bf16 Tensor Cores
    v100 = {"index": 0, "name": "Tesla V100-SXM2-16GB", "memory_gb": 16.9,
            "compute_capability": "7.0", "bf16": False}  # fmt: skip
    gpu = cpu_report(versions={"cuda_build": "12.8"}, driver_present=True, driver="550.54.15",
                     driver_fits_cuda_build=True, cuda_available=True, gpus=[v100])  # fmt: skip
    ((problem, fix),) = doctor.problems(gpu)
    assert "V100" in problem and "trainer.precision=16-mixed" in fix
    # pinned memory that cannot be allocated
    ((problem, fix),) = doctor.problems({**gpu, "gpus": [], "pinned_memory": False})
    assert "data.pin_memory=false" in fix


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024",
         "550.54.15"),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  Release Build",
         "570.86.15"),
        ("535.129.03", "535.129.03"),  # nvidia-smi --query-gpu=driver_version
        ("no driver here", None),
    ],
)  # fmt: skip
def test_driver_version_is_parsed(text: str, version: str | None) -> None:
    assert doctor.parse_driver_version(text) == version


def test_driver_fits_the_cuda_build() -> None:
    assert doctor.driver_fits("12.8", "550.54.15") is True
    assert doctor.driver_fits("12.1", "525.60.13") is True
    assert doctor.driver_fits("12.8", "520.61.05") is False
    assert doctor.driver_fits("13.0", "570.86.15") is False
    assert doctor.driver_fits(None, "550.54.15") is None  # CPU-only torch: nothing to fit


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_doctor_on_cuda(capsys: pytest.CaptureFixture[str]) -> None:
    report = doctor.collect()
    assert report["gpus"] and report["driver"] and report["driver_fits_cuda_build"] is True
    gpu = report["gpus"][0]
    assert gpu["memory_gb"] > 1 and gpu["bf16"] == (torch.cuda.get_device_capability(0)[0] >= 8)
    assert report["pinned_memory"] is True
    bw = report["h2d_bandwidth"]
    assert bw["pinned_gbps"] > 1 and bw["pageable_gbps"] > 0
    assert report["versions"]["cudnn"] and report["versions"]["nccl"]
    assert doctor.problems(report) == [] or not gpu["bf16"]
    doctor.render(report)
    out = capsys.readouterr().out
    assert gpu["name"] in out and "No GPU found" not in out
