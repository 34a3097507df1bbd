"""k-fold cross-validation: folds are disjoint, cover the train+val pool, keep the class
proportions and are fixed by the seed; the test split is held out of every fold; bad settings
fail in one line; a sweep over data.fold ends with cv_summary.json (mean/std of the folds)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from conftest import CONF, final_metrics, run_cli
from fasttrain.assemble import build
from fasttrain.config.errors import UserError
from fasttrain.data.folds import fold_indices
from fasttrain.tools.cv_summary import summarize


def data_module(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["paths.root_dir=/nonexistent", *overrides])
    return build(cfg.data, "data")


def labels(module) -> dict[str, np.ndarray]:
    module.setup()
    return {name: split.tensors[1].numpy() for name, split in module.splits.items()}


def rows_of(module) -> dict[str, set[bytes]]:
    """Each split's samples as a set of raw rows (identity of a sample across fold modules;
    digits has duplicate images, so compare multisets via counts where it matters)."""
    module.setup()
    return {
        name: {x.numpy().tobytes() for x in split.tensors[0]}
        for name, split in module.splits.items()
    }


def test_folds_partition_the_pool_and_hold_out_one_test_split() -> None:
    y = np.repeat(np.arange(4), [40, 30, 20, 10])  # imbalanced classes
    k = 5
    parts = [fold_indices(y, k, i, test_fraction=0.2, seed=3) for i in range(k)]
    test = parts[0][2]
    assert all(np.array_equal(p[2], test) for p in parts)  # one test split for all folds
    vals = [p[1] for p in parts]
    pool = np.setdiff1d(np.arange(len(y)), test)
    assert np.array_equal(np.sort(np.concatenate(vals)), pool)  # disjoint and covering
    for train, val, test_rows in parts:
        assert not set(train) & set(val) and not set(train) & set(test_rows)
        assert np.array_equal(np.sort(np.concatenate([train, val])), pool)
        # stratified: each class's share of the fold within one sample of its share of the pool
        expected = np.bincount(y[pool], minlength=4) / k
        assert np.all(np.abs(np.bincount(y[val], minlength=4) - expected) <= 1)


def test_folds_are_fixed_by_the_seed() -> None:
    y = np.arange(200) % 3
    same = [fold_indices(y, 4, 1, 0.2, seed=7)[1] for _ in range(2)]
    assert np.array_equal(*same)
    assert not np.array_equal(same[0], fold_indices(y, 4, 1, 0.2, seed=8)[1])


def test_digits_folds_through_the_data_module() -> None:
    plain = labels(data_module())
    folds = [labels(data_module(f"data.fold={i}", "data.num_folds=3")) for i in range(3)]
    # The test split of every fold is the same size and class mix; the val splits of the three
    # folds add up to the pool (train + val of any one fold).
    pool = len(folds[0]["train"]) + len(folds[0]["val"])
    assert sum(len(f["val"]) for f in folds) == pool
    assert all(np.array_equal(np.sort(f["test"]), np.sort(folds[0]["test"])) for f in folds)
    assert len(folds[0]["test"]) == len(plain["test"])  # test_fraction as without folds
    for f in folds:
        assert abs(len(f["val"]) - pool / 3) <= 10  # 1/K of the pool, val_fraction unused


def test_wine_fold_val_rows_are_disjoint_and_test_rows_shared() -> None:
    folds = [
        rows_of(data_module("data=wine", f"data.fold={i}", "data.num_folds=4")) for i in range(4)
    ]
    vals = [f["val"] for f in folds]
    assert all(not vals[i] & vals[j] for i in range(4) for j in range(i + 1, 4))
    # Standardisation comes from each fold's own training split, so compare test rows by count.
    assert len({len(f["test"]) for f in folds}) == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.fold=5"], "data.fold=5: expected 0..4 (data.num_folds=5) or null"),
        (["data.num_folds=1", "data.fold=0"], "data.num_folds=1: expected an int >= 2"),
        (["data.fold=-1"], "data.fold=-1: expected an int >= 0 (below data.num_folds), or null"),
    ],
)
def test_bad_fold_settings_fail_in_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        data_module(*overrides)


def test_a_data_set_too_small_for_k_fails_naming_num_folds() -> None:
    # wine: 178 samples, the smallest class 48; 80% of it in the pool is 38 < 40 folds.
    module = data_module("data=wine", "data.num_folds=40", "data.fold=0")
    with pytest.raises(UserError, match=r"^data.num_folds=40: the smallest class has \d+ samples"):
        module.setup()


def test_every_job_of_a_fold_sweep_is_checked_before_it_starts(tmp_path: Path) -> None:
    from fasttrain.cli import construct_each
    from fasttrain.config.overrides import check_command_line

    checked = check_command_line("train", ["-m", "data.fold=0,7", f"paths.log_dir={tmp_path}"])
    with pytest.raises(UserError, match=r"^data.fold=7: expected 0..4"):
        construct_each(checked.jobs)


@pytest.mark.slow  # a subprocess (~10 s): the same check as above, through python train.py
def test_bad_fold_on_the_command_line_writes_nothing(tmp_path: Path) -> None:
    proc = run_cli(["train.py", "-m", "data.fold=0,7"], tmp_path / "logs")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: data.fold=7: expected 0..4")
    assert not (tmp_path / "logs").exists()


def write_job(sweep: Path, num: int, fold: int, metrics: dict[str, float] | None,
              extra: tuple[str, ...] = (), num_folds: int = 5) -> None:  # fmt: skip
    job = sweep / f"{num}_data.fold={fold}"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "config.yaml").write_text(f"data:\n  num_folds: {num_folds}\n")
    overrides = [f"data.fold={fold}", *extra]
    (job / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    if metrics is not None:
        (job / "metrics.json").write_text(json.dumps({"metrics": metrics, "checkpoint": None}))


def test_summary_gives_mean_std_and_per_fold_values(tmp_path: Path) -> None:
    accs = [0.9, 0.8, 0.95]
    for i, acc in enumerate(accs):
        write_job(tmp_path, i, i, {"test/acc": acc, "val/acc": 1 - acc / 2})
    write_job(tmp_path, 3, 3, None)  # a job that never finished
    (group,) = summarize(tmp_path)["groups"]
    assert group["folds"] == [0, 1, 2] and group["missing"] == ["3_data.fold=3"]
    acc = group["metrics"]["test/acc"]
    assert acc["per_fold"] == accs
    assert acc["mean"] == pytest.approx(statistics.fmean(accs))
    assert acc["std"] == pytest.approx(statistics.stdev(accs))


def test_folds_not_run_or_run_twice_are_said(tmp_path: Path) -> None:
    from fasttrain.tools.cv_summary import fold_warnings

    for num, fold in enumerate([0, 1, 1]):
        write_job(tmp_path, num, fold, {"test/acc": 0.5 + num / 10}, num_folds=4)
    (group,) = summarize(tmp_path)["groups"]
    assert group["folds"] == [0, 1] and group["metrics"]["test/acc"]["per_fold"] == [0.5, 0.6]
    assert group["folds_not_run"] == [2, 3] and group["repeated"] == [1]
    lines = fold_warnings(group)
    assert lines[0].startswith("2 of data.num_folds=4 folds finished (not: 2, 3)")
    assert lines[1].startswith("fold(s) 1 ran more than once: each counted once")


def test_summary_groups_jobs_by_their_other_overrides(tmp_path: Path) -> None:
    for num, (fold, seed) in enumerate([(0, 1), (1, 1), (0, 2), (1, 2)]):
        write_job(tmp_path, num, fold, {"test/acc": fold + seed}, extra=(f"seed={seed}",))
    groups = summarize(tmp_path)["groups"]
    assert [g["overrides"] for g in groups] == [["seed=1"], ["seed=2"]]
    assert [g["metrics"]["test/acc"]["per_fold"] for g in groups] == [[1.0, 2.0], [2.0, 3.0]]


@pytest.mark.slow  # three short runs in one sweep (~16 s on 2 cores)
def test_fold_sweep_writes_cv_summary_matching_the_runs(tmp_path: Path) -> None:
    args = ["train.py", "-m", "data=wine", "model=mlp", "data.num_folds=3", "data.fold=range(3)",
            "trainer.max_epochs=1", "data.num_workers=0", "logger=none"]  # fmt: skip
    proc = run_cli(args, tmp_path / "logs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (file,) = (tmp_path / "logs" / "train" / "multirun").glob("*/cv_summary.json")
    (group,) = json.loads(file.read_text())["groups"]
    runs = [file.parent / name for name in group["runs"]]
    assert group["folds"] == [0, 1, 2] and all(r.is_dir() for r in runs)
    for name in ("test/acc", "val/acc"):
        values = [final_metrics(r)[name] for r in runs]
        assert group["metrics"][name]["per_fold"] == values
        assert group["metrics"][name]["mean"] == pytest.approx(statistics.fmean(values))
        assert group["metrics"][name]["std"] == pytest.approx(statistics.stdev(values))
    assert "cross-validation: 3 folds" in proc.stdout and "cv_summary.json" in proc.stdout


def test_a_null_fold_swept_beside_the_folds_is_left_out(tmp_path: Path) -> None:
    # -m data.fold=null,0,1: the usual split compared with the folds; it is no fold to average
    write_job(tmp_path, 0, "null", {"test/acc": 0.1})  # type: ignore[arg-type]
    for num, fold in ((1, 0), (2, 1)):
        write_job(tmp_path, num, fold, {"test/acc": 0.5 + fold / 10})
    (group,) = summarize(tmp_path)["groups"]
    assert group["folds"] == [0, 1] and group["metrics"]["test/acc"]["per_fold"] == [0.5, 0.6]


def sweep_job_config(sweep: Path, fold: int, mode: str = "MULTIRUN"):
    from omegaconf import OmegaConf

    hydra = {"mode": mode, "sweep": {"dir": str(sweep)}, "job": {"num": fold},
             "overrides": {"task": [f"data.fold={fold}"]}}  # fmt: skip
    return OmegaConf.create({"hydra": hydra})


def test_each_finished_job_of_a_fold_sweep_rewrites_the_summary(tmp_path: Path) -> None:
    """Hydra calls on_multirun_end only when every job succeeded: after each job instead, so a
    crashed fold leaves the summary of the others."""
    from hydra.core.utils import JobReturn, JobStatus
    from hydra.types import RunMode

    from fasttrain.tools.crossval import CrossValidationSummary

    write_job(tmp_path, 0, 0, {"test/acc": 0.7})
    write_job(tmp_path, 1, 1, None)  # crashed: no metrics.json
    failed = JobReturn(status=JobStatus.FAILED)
    CrossValidationSummary().on_job_end(sweep_job_config(tmp_path, 1, RunMode.MULTIRUN), failed)
    (group,) = json.loads((tmp_path / "cv_summary.json").read_text())["groups"]
    assert group["folds"] == [0] and group["missing"] == ["1_data.fold=1"]
    assert group["metrics"]["test/acc"]["per_fold"] == [0.7]


def test_a_single_fold_run_writes_no_summary(tmp_path: Path) -> None:
    from hydra.types import RunMode

    from fasttrain.tools.crossval import CrossValidationSummary

    write_job(tmp_path, 0, 0, {"test/acc": 0.7})
    CrossValidationSummary().on_job_end(sweep_job_config(tmp_path, 0, RunMode.RUN), None)
    assert not (tmp_path / "cv_summary.json").exists()


@pytest.mark.slow  # three short runs in one sweep, the first crashing (~16 s on 2 cores)
def test_a_fold_that_crashes_leaves_the_summary_of_the_others(tmp_path: Path) -> None:
    # one step per epoch (the batch holds the training part): a failure at step `fold` hits fold 0
    kill = ["+callbacks.killer._target_=killer.Killer", "+callbacks.killer.at_step=${data.fold}",
            "+callbacks.killer.mode=raise_in_step"]  # fmt: skip
    args = ["train.py", "-m", "data=wine", "model=mlp", "data.num_folds=3", "data.fold=range(3)",
            "data.batch_size=512", "trainer.max_epochs=1", "data.num_workers=0", "logger=none",
            *kill]  # fmt: skip
    proc = run_cli(args, tmp_path / "logs", PYTHONPATH=str(Path(__file__).parent))
    assert proc.returncode != 0  # the crash is still the sweep's outcome
    (file,) = (tmp_path / "logs" / "train" / "multirun").glob("*/cv_summary.json")
    (group,) = json.loads(file.read_text())["groups"]
    assert group["folds"] == [1, 2] and group["missing"][0].startswith("0_")
    assert group["folds_not_run"] == [0]
    assert f"{file} holds the folds that finished" in proc.stderr
