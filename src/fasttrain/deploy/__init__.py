"""Deployment: write a trained net in a serving format, read it back from disk, and check it.

formats.py  one Exporter per format (ONNX, TorchScript, dynamic int8, fp16): write and load back
verify.py   the shared check loop: outputs vs eager, agreement, the task's score, size, latency
run.py      export_and_verify: write each format, check it, write export_report.json
files.py    writes that never leave a half-written file behind
"""

from fasttrain.deploy.files import atomic_path
from fasttrain.deploy.formats import EXPORTERS, FORMATS, Exporter, Format, Runner, torch_runner
from fasttrain.deploy.run import (
    export_and_verify,
    failures,
    resolve_device,
    run_dir_of,
    select,
)
from fasttrain.deploy.verify import Tolerance, verify, write_report

__all__ = [
    "EXPORTERS",
    "FORMATS",
    "Exporter",
    "Format",
    "Runner",
    "Tolerance",
    "atomic_path",
    "export_and_verify",
    "failures",
    "resolve_device",
    "run_dir_of",
    "select",
    "torch_runner",
    "verify",
    "write_report",
]
