"""Export: every format is written, read back and checked against the eager net; bad input fails
cleanly. One short MLP run (Linear layers, so int8 quantises something) serves the module."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from torch import nn

from conftest import CONF, run_cli, run_dirs
from fasttrain.assemble.restore import restore
from fasttrain.config.errors import UserError
from fasttrain.deploy import EXPORTERS, Tolerance, atomic_path, export_and_verify, failures, select
from fasttrain.tasks import export

ROW_FIELDS = {"file", "size_bytes", "max_abs_diff", "agreement", "accuracy", "samples", "device",
              "latency_ms", "passed", "target"}  # fmt: skip
TORCH_FORMATS = ["torchscript", "int8", "fp16"]  # no extra package needed


@pytest.fixture(scope="module")
def ckpt(mlp_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy inside its own <run>/checkpoints/, since the CLI test exports into <run>/export/."""
    path = tmp_path_factory.mktemp("run") / "checkpoints" / "last.ckpt"
    path.parent.mkdir()
    shutil.copy(mlp_ckpt, path)
    return path


def export_cfg(ckpt: Path, tmp_path: Path, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("export", overrides=[
            f"ckpt_path={ckpt}", f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path}/run",
            "data.num_workers=0", "latency_time=0.01", *overrides,
        ])  # fmt: skip


@pytest.fixture(scope="module")
def restored(
    ckpt: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[nn.Module, object, object]:
    """(the net, its data module, the task: what export compares outputs by)."""
    model, datamodule = restore(export_cfg(ckpt, tmp_path_factory.mktemp("cfg")))
    return model.net, datamodule, model


def run_export(restored, formats: list[str], out_dir: Path, **tolerance: float) -> dict:
    net, datamodule, task = restored
    example = next(iter(datamodule.test_dataloader()))[0]
    return export_and_verify(
        net, task, [EXPORTERS[f] for f in formats], example, datamodule.test_dataloader(), out_dir,
        torch.device("cpu"), Tolerance(**tolerance), latency_time=0.01,
    )  # fmt: skip


@pytest.fixture(scope="module")
def torch_export(restored, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("export")
    return run_export(restored, TORCH_FORMATS, out), out


def test_torch_formats_are_written_read_back_and_meet_targets(restored, torch_export) -> None:
    report, tmp_path = torch_export
    rows = report["formats"]
    assert json.loads((tmp_path / "export_report.json").read_text()) == report
    assert list(rows) == ["eager", *TORCH_FORMATS]
    n_test = len(restored[1].test_dataloader().dataset)
    assert report["test_samples"] == n_test and report["device"] == "cpu"
    for name in TORCH_FORMATS:
        row = rows[name]
        assert set(row) >= ROW_FIELDS, name
        assert row["passed"], (name, row)
        assert (tmp_path / row["file"]).stat().st_size == row["size_bytes"] > 0
        assert set(row["latency_ms"]) == {"1", "64"} and min(row["latency_ms"].values()) > 0
    eager = rows["eager"]
    assert eager["accuracy"] > 0.8 and eager["max_abs_diff"] == 0.0  # a trained net, as reference
    assert rows["torchscript"]["max_abs_diff"] <= 1e-4 and rows["torchscript"]["agreement"] == 1.0
    assert rows["int8"]["accuracy"] >= eager["accuracy"] - 0.01
    assert rows["fp16"]["agreement"] >= 0.995
    # int8 and fp16 really are smaller: the weights were converted, not copied.
    assert rows["int8"]["size_bytes"] < 0.5 * eager["size_bytes"]
    assert rows["fp16"]["size_bytes"] < 0.6 * eager["size_bytes"]
    assert rows["int8"]["max_abs_diff"] > 0 and rows["fp16"]["max_abs_diff"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["export_report.json", "model.ts", "model_int8.pt", "model_fp16.pt"]
    )  # no temporary files left


def test_int8_and_fp16_files_are_torchscript_with_converted_weights(torch_export) -> None:
    _, tmp_path = torch_export
    # torch.jit.load alone: no net to rebuild, no quantize_dynamic step (tests/test_truth_export.py
    # runs them in a process where fasttrain cannot be imported).
    fp16 = torch.jit.load(tmp_path / "model_fp16.pt")
    assert {t.dtype for t in fp16.parameters()} == {torch.float16}
    int8 = torch.jit.load(tmp_path / "model_int8.pt")
    assert "LinearPackedParams" in repr(int8)  # dynamic int8 Linear layers, packed weights


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_torchscript_and_fp16_run_there(restored, tmp_path: Path) -> None:
    net, datamodule, task = restored
    example = next(iter(datamodule.test_dataloader()))[0]
    report = export_and_verify(
        net, task, [EXPORTERS["torchscript"], EXPORTERS["fp16"]], example,
        datamodule.test_dataloader(), tmp_path, torch.device("cuda"), Tolerance(), 0.05,
    )  # fmt: skip
    rows = report["formats"]
    assert rows["fp16"]["device"] == rows["torchscript"]["device"] == "cuda"
    assert rows["fp16"]["passed"] and rows["torchscript"]["passed"], rows
    assert rows["fp16"]["max_abs_diff"] > 0  # the weights really were halved


def test_int8_on_a_net_without_linear_layers_says_so(restored, tmp_path: Path) -> None:
    conv_only = nn.Sequential(nn.Conv2d(1, 10, kernel_size=8), nn.Flatten())  # [B,1,8,8]->[B,10]
    report = run_export((conv_only, *restored[1:]), ["int8"], tmp_path)
    assert "no Linear layers" in report["formats"]["int8"]["skipped"]
    assert not (tmp_path / "model_int8.pt").exists()


def test_tolerance_judges_each_criterion() -> None:
    tol = Tolerance()
    assert tol.judge("exact", {"max_abs_diff": 5e-5, "agreement": 1.0}, 0.9)[0]
    assert not tol.judge("exact", {"max_abs_diff": 2e-4, "agreement": 1.0}, 0.9)[0]
    assert not tol.judge("exact", {"max_abs_diff": 0.0, "agreement": 0.99}, 0.9)[0]
    assert tol.judge("accuracy", {"accuracy": 0.895}, 0.9)[0]
    assert not tol.judge("accuracy", {"accuracy": 0.88}, 0.9)[0]
    assert not tol.judge("agreement", {"agreement": 0.99}, 0.9)[0]
    report = {"formats": {"eager": {}, "fp16": {"passed": False, "target": "agreement >= 0.995",
              "max_abs_diff": 0.1, "agreement": 0.99, "accuracy": 0.9}}}  # fmt: skip
    (line,) = failures(report)
    assert line.startswith("fp16: agreement >= 0.995 not met")


@pytest.mark.parametrize("name", ["max_abs_diff", "max_acc_drop", "min_agreement"])
def test_a_nan_tolerance_is_refused(name: str) -> None:
    # NaN passed `< 0`: every format then failed `diff <= nan` and the export exited 1
    # ("max abs diff <= nan ... not met") after writing every file.
    with pytest.raises(UserError, match=f"^{name}=nan: expected"):
        Tolerance(**{name: float("nan")})


@pytest.mark.parametrize("seconds", [float("inf"), float("nan"), 0.0])
def test_a_latency_time_that_never_ends_is_refused_before_writing(
    seconds: float, restored, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # by name: fasttrain.deploy.verify, the attribute, is the function the package re-exports
    verify_module = importlib.import_module("fasttrain.deploy.verify")

    def timed(run, x, min_run_time: float) -> float:  # the real Timer would spin forever on inf
        raise AssertionError(f"timed for {min_run_time} s")

    monkeypatch.setattr(verify_module, "median_ms", timed)
    net, datamodule, task = restored
    with pytest.raises(UserError, match=r"^latency_time=[\w.]+: expected a finite number"):
        export_and_verify(net, task, [EXPORTERS["torchscript"]], next(iter(
            datamodule.test_dataloader()))[0], datamodule.test_dataloader(), tmp_path / "out",
            torch.device("cpu"), Tolerance(), latency_time=seconds)  # fmt: skip
    assert not (tmp_path / "out").exists()


def test_rows_of_other_weights_at_the_same_path_are_not_merged(
    ckpt: Path, restored, tmp_path: Path
) -> None:
    # last.ckpt holds newer weights once its run is resumed: the report kept the row (and named
    # as this checkpoint's the file) of a format exported from the older weights.
    source = tmp_path / "last.ckpt"
    shutil.copy(ckpt, source)
    net, datamodule, task = restored

    def export_one(fmt: str) -> dict:
        return export_and_verify(
            net, task, [EXPORTERS[fmt]], next(iter(datamodule.test_dataloader()))[0],
            datamodule.test_dataloader(), tmp_path / "out", torch.device("cpu"), Tolerance(),
            latency_time=0.01, source=str(source),
        )  # fmt: skip

    export_one("torchscript")
    assert list(export_one("fp16")["formats"]) == ["eager", "torchscript", "fp16"]  # same file
    blob = torch.load(source, weights_only=True)
    blob["global_step"] += 1  # training went on: other bytes at the same path
    torch.save(blob, source)
    report = export_one("int8")
    assert list(report["formats"]) == ["eager", "int8"]
    saved = json.loads((tmp_path / "out" / "export_report.json").read_text())
    assert saved["checkpoint_sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "model.ts"
    target.write_text("previous")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash mid-export")
    assert target.read_text() == "previous" and list(tmp_path.iterdir()) == [target]


def test_onnx_without_the_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "onnxscript" else real(name)
    )
    with pytest.raises(UserError, match=r"format=onnx: needs onnxscript.*\.\[export\]"):
        select("onnx")
    assert [e.name for e in select("int8")] == ["int8"]


def test_bad_settings_fail_before_anything_is_read(ckpt: Path, tmp_path: Path) -> None:
    for override, message in [
        ("device=tpu", "device='tpu': expected one of"),
        ("latency_time=0", "latency_time=0: expected seconds > 0"),
        ("tolerance.min_agreement=1.5", "tolerance.min_agreement=1.5: expected a share"),
    ]:
        with pytest.raises(UserError, match=message):
            export(export_cfg(ckpt, tmp_path, override, "output_dir=" + str(tmp_path / "out")))
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # tens of seconds: CI runs it in make test-slow
def test_cli_exports_all_formats_into_the_run_dir(ckpt: Path, restored, tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    proc = run_cli(["-m", "fasttrain.export", f"ckpt_path={ckpt}", "latency_time=0.02",
                    "data.num_workers=0"], tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = ckpt.parents[1] / "export"  # <run>/checkpoints/last.ckpt -> <run>/export/
    report = json.loads((out / "export_report.json").read_text())
    assert list(report["formats"]) == ["eager", "onnx", "torchscript", "int8", "fp16"]
    assert all(row["passed"] for name, row in report["formats"].items() if name != "eager")
    assert all((out / EXPORTERS[name].filename).is_file() for name in EXPORTERS)
    assert "export check" in proc.stdout and "torchscript" in proc.stdout
    assert "Warning" not in proc.stderr, proc.stderr[-2000:]  # torch's legacy-API noise is muted
    # One ONNX file serves any batch size: neither 1 nor 3 is the example's batch. It takes raw
    # inputs: the data module's standardisation is inside the graph.
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    net, (mean, std) = restored[0].eval(), restored[1].input_statistics()
    for batch in (1, 3):
        x = torch.randint(0, 17, (batch, 1, 8, 8)).float()  # digits' raw pixels are 0..16
        (logits,) = session.run(None, {"input": x.numpy()})
        with torch.no_grad():
            assert torch.allclose(torch.from_numpy(logits), net((x - mean) / std), atol=1e-4)


def corrupt(tmp_path: Path, ckpt: Path) -> Path:
    path = tmp_path / "corrupt.ckpt"
    path.write_bytes(b"PK\x03\x04 not a zip archive at all")
    return path


def foreign(tmp_path: Path, ckpt: Path) -> Path:
    """A Lightning checkpoint of some other LightningModule: weights, but no net spec."""
    path = tmp_path / "foreign.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(2)}, "hyper_parameters": {"lr": 0.1}}, path)
    return path


def mismatched(tmp_path: Path, ckpt: Path) -> Path:
    """Our checkpoint whose net spec names other layer widths than its weights have."""
    blob = torch.load(ckpt, weights_only=True)
    blob["hyper_parameters"]["net"]["hidden"] = [32]
    path = tmp_path / "mismatched.ckpt"
    torch.save(blob, path)
    return path


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (corrupt, "not a readable checkpoint"),
        (foreign, "not a fasttrain task checkpoint"),
        (mismatched, "weights do not fit the net it names (Error(s) in loading state_dict"),
    ],
    ids=["corrupt", "other-model", "mismatched-weights"],
)
def test_bad_checkpoint_is_one_line_and_writes_nothing(
    make, message: str, ckpt: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    cfg = export_cfg(make(tmp_path, ckpt), tmp_path, f"output_dir={out}", "format=torchscript")
    with pytest.raises(UserError, match=re.escape(message)) as err:
        export(cfg)
    assert "\n" not in str(err.value) and not out.exists()


def test_a_net_for_other_data_is_named(ckpt: Path, tmp_path: Path) -> None:
    blob = torch.load(ckpt, weights_only=True)
    del blob["datamodule_hyper_parameters"]  # nothing ties the split to the net's input any more
    del blob["datamodule_target"]  # as in older checkpoints: only the shapes can be compared
    torch.save(blob, tmp_path / "x.ckpt")
    cfg = export_cfg(tmp_path / "x.ckpt", tmp_path, "data=synthetic", "format=torchscript")
    with pytest.raises(UserError, match=r"net takes inputs \[1, 8, 8\] but data .*\[3, 32, 32\]"):
        export(cfg)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ckpt_path=missing.ckpt"], "error: ckpt_path=missing.ckpt: no such file"),
        pytest.param(
            ["ckpt_path=CKPT", "format=tflite"],
            "error: format='tflite': expected one of 'onnx', ",
            marks=pytest.mark.slow,
        ),
    ],
    ids=["missing", "unknown-format"],
)
def test_cli_bad_input_is_one_line_exit_2_and_writes_nothing(
    args: list[str], message: str, ckpt: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    args = [a.replace("CKPT", str(ckpt)) for a in args]
    proc = run_cli(["-m", "fasttrain.export", f"output_dir={out}", *args], tmp_path / "logs")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith(message) and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists() and run_dirs(tmp_path / "logs", "export") == []
