"""The machinery takes any task through the task contract (fasttrain.models.task): for every
task in conf/model and each of its nets (fasttrain.testing.cases), a checkpoint round trip, a short
run, then evaluate, export and predict on its checkpoint, and a resumed run. A task, net or data
set added under conf/ is tested here the day it is added."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, open_dict

from fasttrain.assemble import build_model
from fasttrain.assemble.restore import restore
from fasttrain.checkpoints.load import load_task
from fasttrain.models.spec import qualname
from fasttrain.models.task import TASK_TARGET_KEY, Task
from fasttrain.testing.cases import CONF, SHORT, case_id, cases, compose_train, plain_cases

CASES = cases()
PLAIN_CASES = plain_cases()


def entry_cfg(entry: str, ckpt: Path, data: str, out: Path, *overrides: str) -> DictConfig:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(entry, overrides=[
            f"ckpt_path={ckpt}", f"data={data}", f"paths.root_dir={out}",
            f"paths.output_dir={out}/run", "data.num_workers=0", *overrides,
        ])  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_checkpoint_round_trip(case: tuple[str, str, str], tmp_path: Path) -> None:
    task, data, net = case
    cfg = compose_train([f"model={task}", f"data={data}", f"model/net={net}"], tmp_path)
    model = build_model(cfg.model).eval()
    ckpt = tmp_path / "model.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams),
                TASK_TARGET_KEY: qualname(type(model))}, ckpt)  # fmt: skip
    rebuilt, _ = load_task(ckpt)
    assert type(rebuilt) is type(model) and isinstance(rebuilt, Task)
    x = model.example_inputs(4, cfg.data.input_shape)
    with torch.no_grad():
        assert torch.equal(rebuilt(x), model(x))


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """case -> (its run folder, its final metrics): one short run per case, on first use."""
    return {}


def run_of(case: tuple[str, str, str], trained: dict, factory: pytest.TempPathFactory):
    if case not in trained:
        from fasttrain.tasks import train

        task, data, net = case
        root = factory.mktemp(case_id(case))
        cfg = compose_train([f"model={task}", f"data={data}", f"model/net={net}", *SHORT], root)
        trained[case] = (root / "run", train(cfg), cfg)
    return trained[case]


# A language model's export (ONNX and TorchScript traced at several lengths, each timed and
# checked) takes over a minute on a 2-core CPU: those cases run with the long tests (-m slow).
EXPORT_CASES = [pytest.param(c, marks=pytest.mark.slow) if c[1] == "text" else c for c in CASES]


@pytest.mark.parametrize("case", EXPORT_CASES, ids=case_id)
def test_short_run_then_evaluate_export_predict(
    case: tuple[str, str, str], trained: dict, tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
) -> None:  # fmt: skip
    from fasttrain.tasks import evaluate, export, predict

    run, metrics, _ = run_of(case, trained, tmp_path_factory)
    _, data, _ = case
    record = json.loads((run / "metrics.json").read_text())
    best = Path(record["checkpoint"])
    model, datamodule = restore(entry_cfg("eval", best, data, tmp_path / "r"))
    monitor = model.monitor  # the task's own metric, and its test twin, were logged
    test_metric = "test/" + monitor.split("/", 1)[1]
    assert record["monitor"] == monitor and math.isfinite(metrics[test_metric])
    assert f"{monitor}_best" in metrics
    # The best checkpoint is on the task's metric, its name carries its value.
    assert monitor.rsplit("/", 1)[-1] in best.name

    # The same test batches as the run's own test (SHORT limits them).
    evaluated = evaluate(entry_cfg("eval", best, data, tmp_path / "e",
                                   "++trainer.limit_test_batches=2"))  # fmt: skip
    assert evaluated[test_metric] == pytest.approx(metrics[test_metric], rel=1e-5, abs=1e-6)

    formats = "torchscript" if not _has("onnx", "onnxruntime") else "all"
    report = export(entry_cfg("export", best, data, tmp_path / "x", f"format={formats}",
                              f"output_dir={tmp_path}/export", "latency_time=0.01"))  # fmt: skip
    score = report["score"]
    for name in ("torchscript", "onnx"):
        if name in report["formats"]:
            row = report["formats"][name]
            assert row["passed"] and row["agreement"] == 1.0, (name, row)
            assert row[score] == pytest.approx(report["formats"]["eager"][score], abs=1e-6)
    # The exported file takes raw inputs and gives the task's outputs (its units), as the
    # model's own forward on the data module's batches.
    ts = torch.jit.load(tmp_path / "export" / "model.ts")
    x, _ = next(iter(datamodule.test_dataloader()))
    from fasttrain.deploy.inputs import input_statistics, raw_batches

    mean, std = input_statistics(datamodule, model)
    own = model.export_module() is not None  # the task's own inputs (token ids): as they are
    raw = x if own else next(raw_batches([(x, None)], mean, std, model))[0]
    with torch.no_grad():
        assert torch.allclose(ts(raw), model(x).float(), atol=1e-4, rtol=1e-4)

    if hasattr(model, "generate"):  # a language model's predict continues a prompt
        out = predict(entry_cfg("predict", best, data, tmp_path / "p", f"output_dir={tmp_path}/p",
                                "prompt='def '", "max_new_tokens=8"))  # fmt: skip
        assert out.name == "generation.txt" and out.read_text().startswith("def ")
        return
    out = predict(entry_cfg("predict", best, data, tmp_path / "p", f"output_dir={tmp_path}/p"))
    with out.open(newline="") as f:
        rows = list(csv.reader(f))
    header = rows[0]
    assert header[: 1 + len(model.prediction_header(datamodule))] == [
        "index",
        *model.prediction_header(datamodule),
    ]
    assert header[-1].startswith("label")
    assert len(rows) - 1 == len(datamodule.test_dataloader().dataset)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_resume_continues_the_run(
    case: tuple[str, str, str], trained: dict, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from fasttrain.tasks import train

    run, _, cfg = run_of(case, trained, tmp_path_factory)
    before = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    longer = cfg.copy()
    with open_dict(longer):
        longer.trainer.max_epochs = 2
        longer.resume = "auto"
    train(longer)
    after = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert (before["epoch"], after["epoch"]) == (0, 1)
    assert after["global_step"] == 2 * before["global_step"] > 0
    assert after[TASK_TARGET_KEY] == before[TASK_TARGET_KEY]


def _has(*modules: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("os.system", "refused, its task names os.system"),
        ("fasttrain.models.spec.plain", "refused, its task names fasttrain.models.spec.plain"),
        ("fasttrain.models.task.Task", "does not follow the task contract"),
    ],
)
def test_a_checkpoint_naming_another_task_is_refused_before_anything_is_built(
    target: str, message: str, tmp_path: Path
) -> None:
    from fasttrain.config.errors import UserError

    cfg = compose_train(["model=mlp"], tmp_path)
    model = build_model(cfg.model)
    ckpt = tmp_path / "crafted.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": dict(model.hparams),
                TASK_TARGET_KEY: target}, ckpt)  # fmt: skip
    with pytest.raises(UserError, match=message) as err:
        load_task(ckpt)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("case", PLAIN_CASES, ids="-".join)
def test_a_plain_module_trains_evaluates_and_resumes(case: tuple[str, str], tmp_path: Path) -> None:
    """A plain LightningModule in conf/model: a short run, evaluate on its last checkpoint
    (the same test metrics), and a resumed run one epoch longer."""
    from fasttrain.tasks import evaluate, train

    option, data = case
    cfg = compose_train([f"model={option}", f"data={data}", *SHORT], tmp_path)
    metrics = train(cfg)
    held_out = {k: v for k, v in metrics.items() if k.startswith("test/")}
    assert held_out and all(math.isfinite(v) for v in held_out.values()), metrics
    last = tmp_path / "run" / "checkpoints" / "last.ckpt"
    evaluated = evaluate(entry_cfg("eval", last, data, tmp_path / "e",
                                   "++trainer.limit_test_batches=2"))  # fmt: skip
    for name, value in held_out.items():
        assert evaluated[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name
    longer = cfg.copy()
    with open_dict(longer):
        longer.trainer.max_epochs, longer.resume = 2, "auto"
    train(longer)
    assert torch.load(last, weights_only=True)["epoch"] == 1
