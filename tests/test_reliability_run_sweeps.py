"""The sweeps of docs/sweeps.md as written (no paths.* override, from an empty folder, or with
FASTTRAIN_ROOT), each job with its own log; every swept value checked before Hydra writes the
sweep folder, and Hydra's flags no longer skip the command-line check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_reliability_run_names import files_under, main_in

from conftest import REPO

SMALL = ["model=mlp", "trainer.max_epochs=1", "data.num_workers=0", "logger=none",
         "trainer.limit_train_batches=2", "trainer.limit_val_batches=2", "test=false",
         "callbacks.progress_bar=null"]  # fmt: skip


def user_env(**env: str) -> dict[str, str]:
    """A user's environment: no FASTTRAIN_ROOT or HYDRA_FULL_ERROR unless given, no GPU."""
    base = {k: v for k, v in os.environ.items() if k not in ("FASTTRAIN_ROOT", "HYDRA_FULL_ERROR")}
    return {**base, "CUDA_VISIBLE_DEVICES": "", **env}


def train(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """`python <repo>/train.py <args>` started in `cwd`, as a user types it: no paths override."""
    return subprocess.run(
        [sys.executable, str(REPO / "train.py"), *args],
        cwd=cwd, env=user_env(**env), capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def jobs_of(root: Path) -> list[Path]:
    return sorted(p.parent.parent for p in root.glob("logs/train/multirun/*/*/.hydra/config.yaml"))


@pytest.mark.slow  # tens of seconds: CI runs it in make test-slow
def test_readme_grid_sweep_runs_from_an_empty_folder(tmp_path: Path) -> None:
    # Was: InterpolationResolutionError "HydraConfig was not set" (hydra.sweep.dir derived from
    # ${hydra:runtime.cwd}, which Hydra resolves before it sets its config).
    proc = train(["-m", "seed=1,2", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = jobs_of(tmp_path)
    assert [j.name.split("_", 1)[0] for j in jobs] == ["0", "1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["logs"]
    for job in jobs:
        assert (job / "metrics.json").is_file()
        # each job's own log holds its Lightning lines (it was 0 bytes)
        assert "GPU available" in (job / "train.log").read_text()
    assert (proc.stdout + proc.stderr).count("GPU available") == 2  # once per job


@pytest.mark.slow
def test_readme_grid_of_four_runs(tmp_path: Path) -> None:
    proc = train(["-m", "model.optimizer.lr=1e-3,3e-3", "seed=1,2", *SMALL], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = [(j / ".hydra" / "overrides.yaml").read_text() for j in jobs_of(tmp_path)]
    assert len(jobs) == 4
    for lr in ("0.001", "0.003"):
        for seed in ("1", "2"):
            assert any(f"model.optimizer.lr={lr}" in j and f"seed={seed}" in j for j in jobs)


@pytest.mark.slow
@pytest.mark.parametrize("root", ["cwd", "FASTTRAIN_ROOT"])
def test_readme_optuna_search(root: str, tmp_path: Path) -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    launch, home = tmp_path / "launch", tmp_path / "home"
    launch.mkdir()
    env = {"FASTTRAIN_ROOT": str(home)} if root == "FASTTRAIN_ROOT" else {}
    args = ["-m", "hparams_search=optuna", "hydra.sweeper.n_trials=2", "trainer.max_epochs=1",
            "data.num_workers=0", "logger=none", "trainer.limit_train_batches=2",
            "test=false"]  # fmt: skip
    proc = train(args, launch, **env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    where = home if env else launch
    assert len(jobs_of(where)) == 2
    assert list(where.glob("logs/train/multirun/*/optimization_results.yaml"))
    if env:
        assert files_under(launch) == []  # nothing in the launch folder


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-m", "data.batch_size=0,64"], "data.batch_size=0: expected an int >= 1"),
        (["-m", "data.batch_size=64,0"], "data.batch_size=0: expected an int >= 1"),
        (["-m", "seed=1,2", "trainer.accumulate_grad_batches=0"],
         "trainer.accumulate_grad_batches=0: expected an int >= 1"),
        (["--multirun", "seed=1,2", "trainer.max_epoch=3"],
         "trainer.max_epoch=3: no such key; did you mean trainer.max_epochs?"),
        (["--cfg", "job", "trainer.max_epoch=3"], "did you mean trainer.max_epochs?"),
        (["-m", "model.optimizer.lr=1e-3,-1"], "model.optimizer.lr=-1"),
        (["-m", "seed=range(0,40)", "model.net.dropout=0.1,1.5"], "model.net.dropout=1.5"),
        (["seed=1,2"], "seed=1,2: several values sweep only with -m"),
    ],
    ids=["first_value", "second_value", "fixed_bad", "typo_multirun", "typo_cfg", "lr",
         "big_grid", "sweep_without_m"],
)  # fmt: skip
def test_every_swept_value_is_checked_before_the_sweep_folder(
    argv: list[str], expected: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    # Hydra's parser takes flags before the overrides (`train.py x=1 -m y=2` is its usage error)
    code, err = main_in(tmp_path, [*argv, "model=mlp"], monkeypatch, capsys)
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert files_under(tmp_path) == []  # no sweep folder, no logs/


def test_optuna_search_space_is_checked_value_by_value() -> None:
    pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
    from fasttrain.config.overrides import check_command_line

    # conf/hparams_search/optuna.yaml sets hydra.mode=MULTIRUN: a sweep even without -m
    checked = check_command_line("train", ["hparams_search=optuna"])
    assert checked.run_dir is None  # no single run folder to claim
    jobs = checked.jobs
    assert {j.data.batch_size for j in jobs} == {32, 64, 128}
    assert {tuple(j.model.net.channels) for j in jobs} == {(16, 32), (32, 64), (64, 128)}
    assert {1e-4, 1e-2} <= {j.model.optimizer.lr for j in jobs}  # the interval's ends


def test_hydra_command_line_parser_is_where_the_check_takes_it() -> None:
    # fasttrain.config.overrides reads flags with Hydra's private parser (no public one).
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args(["-m", "--cfg", "job", "seed=1,2"])
    assert args.multirun and args.cfg == "job" and args.overrides == ["seed=1,2"]
