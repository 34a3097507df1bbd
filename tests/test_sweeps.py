"""Sweeps: the run returns its optimised metric to the sweeper; Optuna and grid sweeps run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import final_metrics, run_cli
from fasttrain.cli import optimized_metric
from fasttrain.config.errors import UserError

SHORT = ["trainer.max_epochs=1", "data.num_workers=0", "data.batch_size=256"]


def sweep_runs(log_dir: Path) -> list[Path]:
    return sorted(p.parent.parent for p in log_dir.glob("train/multirun/*/*/.hydra/config.yaml"))


def test_optimized_metric_is_looked_up_or_fails_naming_the_logged_ones() -> None:
    metrics = {"val/acc": 0.5, "val/acc_best": 0.75, "test/acc": 0.7}
    assert optimized_metric(metrics, "val/acc_best") == 0.75
    assert optimized_metric(metrics, None) is None
    with pytest.raises(UserError, match=r"optimized_metric='val/accc'.*test/acc, val/acc, val/acc"):
        optimized_metric(metrics, "val/accc")


@pytest.mark.slow  # tens of seconds: CI runs it in make test-slow
def test_unknown_metric_fails_the_run_clearly(tmp_path: Path) -> None:
    proc = run_cli(["train.py", *SHORT, "optimized_metric=val/accuracy"], tmp_path)
    assert proc.returncode == 2
    assert "error: optimized_metric='val/accuracy'" in proc.stderr and "val/acc_best" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # tens of seconds: CI runs it in make test-slow
def test_optuna_search_maximises_the_metric_the_runs_return(tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    proc = run_cli(
        # the batch size is searched: shortened by batch count instead
        ["train.py", "-m", "hparams_search=optuna", "hydra.sweeper.n_trials=2",
         "trainer.max_epochs=1", "data.num_workers=0", "trainer.limit_train_batches=3"],
        tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "setup plugin" not in proc.stdout + proc.stderr  # alembic's INFO lines stay quiet
    runs = sweep_runs(tmp_path)
    assert len(runs) == 2
    (result,) = tmp_path.glob("train/multirun/*/optimization_results.yaml")
    best = yaml.safe_load(result.read_text())
    # Optuna saw exactly what each run measured: its best value is the best trial's val/acc_best.
    assert best["best_value"] == pytest.approx(max(final_metrics(r)["val/acc_best"] for r in runs))
    assert set(best["best_params"]) == {
        "model.optimizer.lr",
        "data.batch_size",
        "model.net.channels",
    }
    # each trial's folder names its sampled values
    assert all("lr=" in r.name for r in runs)  # keys cut to an ending that names one setting


@pytest.mark.slow
def test_grid_sweep_runs_every_combination(tmp_path: Path) -> None:
    proc = run_cli(["train.py", "-m", "model.optimizer.lr=1e-3,3e-3", "seed=1,2", *SHORT], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = sweep_runs(tmp_path)
    names = {r.name.split("_", 1)[1] for r in runs}
    assert len(runs) == 4 and len(names) == 4
    for lr in ("0.001", "0.003"):
        for seed in ("1", "2"):
            assert any(f"lr={lr}" in n and f"seed={seed}" in n for n in names)


@pytest.mark.slow
def test_ddp_cpu_multirun_makes_one_tree_per_job(tmp_path: Path) -> None:
    # Lightning restarts the script for rank 1 with the sweep's command line; each job's ranks
    # must run that job only, in its folder (fasttrain.distributed.multirun), and the second job
    # must form a new process group rather than wait on the first job's.
    args = ["train.py", "-m", "trainer=ddp_cpu", "seed=1,2", "model=mlp", "debug=limit"]
    proc = run_cli(args, tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (sweep,) = (tmp_path / "train" / "multirun").iterdir()
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir())
    assert [j.name.split("_", 1)[0] for j in jobs] == ["0", "1"]
    assert sorted(p.name for p in tmp_path.rglob(".hydra")) == [".hydra", ".hydra"]
    for job in jobs:
        assert "test/acc" in final_metrics(job)
        assert len(list(job.glob("events.out.tfevents.*"))) >= 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train"]
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == ["multirun"]


def test_a_rank_takes_the_sweep_job_only_from_its_own_parent(monkeypatch) -> None:
    # The job's overrides reach the ranks Lightning starts through the environment, which every
    # later child of the sweep process inherits too: a plain ddp run started after an in-process
    # sweep must not run that sweep's job (its rank 1 ran an Optuna study, rank 0 waited).
    import json
    import os

    from fasttrain.distributed.multirun import JOB_ENV, rank_argv

    monkeypatch.setenv("LOCAL_RANK", "1")
    own = ["trainer=ddp_cpu", "hydra.job.name=train_ddp_process_1"]
    job = {"pid": os.getppid(), "args": ["seed=2", 'hydra.run.dir="x"']}
    monkeypatch.setenv(JOB_ENV, json.dumps(job))
    assert rank_argv(own) == ["seed=2", 'hydra.run.dir="x"', "hydra.job.name=train_ddp_process_1"]
    monkeypatch.setenv(JOB_ENV, json.dumps({**job, "pid": os.getppid() + 1}))
    assert rank_argv(own) == own
