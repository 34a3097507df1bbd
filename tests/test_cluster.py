"""hydra/launcher=slurm: the sbatch script submitit would submit, checked without a cluster."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from conftest import CONF

pytest.importorskip("hydra_plugins.hydra_submitit_launcher")


@pytest.fixture(autouse=True)
def fake_srun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # submitit refuses to build a SLURM executor where `srun` is not on PATH; a stand-in that
    # is never run lets it render the sbatch script here. Nothing is submitted.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def sbatch_script(tmp_path: Path, overrides: list[str]) -> str:
    """Compose train.yaml with the SLURM launcher, build submitit's executor from
    hydra.launcher the way the launcher plugin does, and render its submission file."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(
            "train",
            overrides=["hydra/launcher=slurm", f"paths.root_dir={tmp_path}", *overrides],
            return_hydra_config=True,
        )
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=True)
    assert isinstance(params, dict)
    assert params["_target_"].endswith("SlurmLauncher")
    folder = tmp_path / "submitit"
    executor = submitit.AutoExecutor(cluster="slurm", folder=folder)
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    skip = {"_target_", "submitit_folder", "max_num_timeout"}
    executor.update_parameters(**{
        (k if k in base else f"slurm_{k}"): v for k, v in params.items() if k not in skip
    })  # fmt: skip
    return executor._executor._make_submission_file_text("python train.py", "job")


def test_slurm_job_matches_the_trainer(tmp_path: Path) -> None:
    script = sbatch_script(tmp_path, [
        "trainer=ddp", "trainer.devices=4", "trainer.num_nodes=2",
        "hydra.launcher.partition=gpu", "hydra.launcher.timeout_min=240",
    ])  # fmt: skip
    lines = set(script.splitlines())
    # one task per GPU on each node: what Lightning's SLURMEnvironment expects
    assert {
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=240",
        "#SBATCH --cpus-per-task=8",
    } <= lines
    assert "python train.py" in script


def test_single_node_defaults(tmp_path: Path) -> None:
    lines = set(sbatch_script(tmp_path, ["trainer=gpu"]).splitlines())
    assert {"#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1", "#SBATCH --time=60"} <= lines
    assert not any(line.startswith("#SBATCH --partition") for line in lines)
