"""Exports deploy as docs/export-and-predict.md says: every file takes raw inputs (the
preprocessing is inside), loads with its runtime alone in a process where fasttrain cannot be
imported, and reaches the eager accuracy there; the report and the files say what input they
take; predict takes raw inputs too and names every class's probability."""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from test_export import export_cfg
from test_predict import predict_cfg

from fasttrain.assemble.restore import restore
from fasttrain.tasks import export, predict

HAS_ONNX = all(importlib.util.find_spec(m) for m in ("onnx", "onnxruntime", "onnxscript"))
FILES = {"torchscript": "model.ts", "int8": "model_int8.pt", "fp16": "model_fp16.pt"}

# Run by a bare `python -I` (no PYTHONPATH, no working directory on sys.path) that also blocks
# `import fasttrain` (an editable install would otherwise find it): a deployment machine.
DEPLOY = r"""
import json, sys
sys.modules["fasttrain"] = None
try:
    import fasttrain  # noqa: F401
    sys.exit("fasttrain is importable")
except ImportError:
    pass
import numpy as np, torch
folder, files = sys.argv[1], json.loads(sys.argv[2])
x = np.load(f"{folder}/x_raw.npy")  # raw pixels, float32 [N, 1, 8, 8]
y = np.load(f"{folder}/y.npy")
accuracy, meta = {}, {}
for name, file in files.items():
    if file.endswith(".onnx"):
        import onnxruntime as ort
        session = ort.InferenceSession(f"{folder}/{file}", providers=["CPUExecutionProvider"])
        logits = session.run(None, {"input": x})[0]
        meta[name] = session.get_modelmeta().custom_metadata_map
    else:
        extra = {"fasttrain.json": ""}
        module = torch.jit.load(f"{folder}/{file}", _extra_files=extra)
        with torch.no_grad():
            logits = module(torch.from_numpy(x)).numpy()
        meta[name] = json.loads(extra["fasttrain.json"])
    accuracy[name] = float((logits.argmax(1) == y).mean())
print(json.dumps({"accuracy": accuracy, "meta": meta}))
"""


@pytest.fixture(scope="module")
def exported(mlp_ckpt: Path, tmp_path_factory: pytest.TempPathFactory):
    """(export folder, the report, eager accuracy on the test split, raw test inputs, labels)."""
    tmp = tmp_path_factory.mktemp("deploy")
    out = tmp / "out"
    report = export(export_cfg(mlp_ckpt, tmp, f"output_dir={out}",
                               f"format={'all' if HAS_ONNX else 'torchscript'}"))  # fmt: skip
    if not HAS_ONNX:  # the torch formats need no extra: export them one by one (merged report)
        for fmt in ("int8", "fp16"):
            report = export(export_cfg(mlp_ckpt, tmp, f"output_dir={out}", f"format={fmt}"))
    model, datamodule = restore(export_cfg(mlp_ckpt, tmp))
    x, y = datamodule.test_dataloader().dataset.tensors
    mean, std = datamodule.input_statistics()
    raw = (x * std + mean).round()  # digits' pixels are integers 0..16
    assert torch.allclose(raw, x * std + mean, atol=1e-4) and 0 <= raw.min() <= raw.max() <= 16
    with torch.no_grad():
        eager = (model.net.eval()(x).argmax(1) == y).float().mean().item()
    np.save(out / "x_raw.npy", raw.numpy().astype(np.float32))
    np.save(out / "y.npy", y.numpy())
    return out, report, eager, raw, y


def test_raw_inputs_are_the_data_sets_own_pixels(exported) -> None:
    _, _, _, raw, _ = exported
    digits = {tuple(row) for row in load_digits().data.astype(np.float32)}
    assert all(tuple(row) in digits for row in raw.flatten(1).numpy())


def test_every_file_loads_without_fasttrain_and_reaches_eager_accuracy(exported) -> None:
    out, report, eager, _, y = exported
    files = {**FILES, **({"onnx": "model.onnx"} if HAS_ONNX else {})}
    proc = subprocess.run(
        [sys.executable, "-I", "-c", DEPLOY, str(out), json.dumps(files)],
        capture_output=True, text=True, timeout=300, cwd=out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    one = 1 / len(y)
    assert eager > 0.8
    for name in ("torchscript", "onnx"):
        if name in files:
            assert abs(result["accuracy"][name] - eager) <= one + 1e-9, (name, result, eager)
    assert result["accuracy"]["int8"] >= eager - 0.01, result
    assert result["accuracy"]["fp16"] >= eager - 0.01, result
    # The export's own check ran on raw inputs too: its eager row is the net's accuracy.
    assert abs(report["formats"]["eager"]["accuracy"] - eager) <= one + 1e-9
    # Each file says what it takes, as the report does.
    for name, meta in result["meta"].items():
        assert meta == report["input"], name
    assert report["input"]["input"].startswith("raw float32 [N, 1, 8, 8]")


def test_the_files_carry_the_training_splits_statistics(exported, mlp_ckpt: Path) -> None:
    _, report, _, _, _ = exported
    _, datamodule = restore(export_cfg(mlp_ckpt, Path(report["output_dir"]).parent))
    mean, std = datamodule.input_statistics()
    assert mean.numel() == std.numel() == 1  # digits: one mean/std for all pixels
    assert float(report["input"]["mean"]) == pytest.approx(mean.item(), rel=1e-6)
    assert float(report["input"]["std"]) == pytest.approx(std.item(), rel=1e-6)
    assert 4 < mean.item() < 6 and 5 < std.item() < 7  # pixels 0..16, not already standardised


def test_exporting_one_format_keeps_the_others_in_the_report(exported) -> None:
    out, report, _, _, _ = exported
    expected = ["eager", *(["onnx"] if HAS_ONNX else []), "torchscript", "int8", "fp16"]
    assert list(report["formats"]) == expected
    assert list(json.loads((out / "export_report.json").read_text())["formats"]) == expected


def test_a_report_of_another_checkpoint_is_not_merged(exported, tmp_path: Path) -> None:
    from fasttrain.deploy.run import merged

    out, report, _, _, _ = exported
    rows = {"eager": {}, "int8": {"file": "model_int8.pt"}}
    assert list(merged(out, report["checkpoint"], rows)) == list(report["formats"])
    assert list(merged(out, "other.ckpt", rows)) == ["eager", "int8"]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_predict_takes_raw_inputs_and_names_every_class(mlp_ckpt: Path, tmp_path: Path) -> None:
    x, y = load_digits(return_X_y=True)  # what a user has: raw pixels 0..16, [N, 64]
    np.save(tmp_path / "x.npy", x[:300].reshape(-1, 1, 8, 8))
    out = predict(predict_cfg(mlp_ckpt, tmp_path, f"input={tmp_path}/x.npy",
                              f"output_dir={tmp_path}/out"))  # fmt: skip
    rows = read_csv(out)
    names = [str(i) for i in range(10)]
    assert list(rows[0]) == ["index", "pred", "class", "prob", *(f"prob_{n}" for n in names)]
    assert [int(r["index"]) for r in rows] == list(range(300))  # the row of x.npy
    accuracy = np.mean([int(r["pred"]) == label for r, label in zip(rows, y[:300], strict=True)])
    assert accuracy > 0.9  # raw pixels are standardised as in training (not ~0.67)
    for r in rows[:20]:
        probs = [float(r[f"prob_{n}"]) for n in names]
        assert sum(probs) == pytest.approx(1.0, abs=1e-4)
        assert float(r["prob"]) == max(probs) and r["class"] == names[int(r["pred"])]
