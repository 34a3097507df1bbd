"""evaluate, export and predict run a checkpoint on the data module it was trained on: another
`data=` selection is refused in one line that names the group to select; checkpoints of older
versions, which did not record their data module, load as before."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from practices import build_run, compose_train

from conftest import CONF
from fasttrain.assemble.restore import restore


@pytest.fixture(autouse=True)
def _fresh_log_streams():
    """In-process Hydra runs leave handlers on the previous test's closed stderr."""
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, logging.StreamHandler) and getattr(
                getattr(handler, "stream", None), "closed", False
            ):
                handler.stream = sys.stderr


@pytest.fixture(scope="module")
def npy_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of a few steps on data=npy: 8x8 arrays like digits, another data module."""
    tmp = tmp_path_factory.mktemp("npy")
    rng = np.random.default_rng(0)
    np.save(tmp / "x.npy", rng.normal(size=(120, 1, 8, 8)).astype(np.float32))
    np.save(tmp / "y.npy", rng.integers(0, 10, 120))
    trainer, model, datamodule = build_run(compose_train(tmp, "data=npy", f"data.path={tmp}"))
    trainer.fit(model, datamodule=datamodule)
    path = tmp / "npy.ckpt"
    trainer.save_checkpoint(path)
    return path


def eval_cfg(ckpt: Path, tmp_path: Path, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose("eval", overrides=[
            f"ckpt_path={ckpt}", f"paths.root_dir={tmp_path}", f"paths.output_dir={tmp_path}/run",
            "data.num_workers=0", *overrides,
        ])  # fmt: skip


def test_the_checkpoint_records_its_data_module(npy_ckpt: Path) -> None:
    ckpt = torch.load(npy_ckpt, weights_only=True)
    assert ckpt["datamodule_target"] == "fasttrain.data.npy.NpyDataModule"


def test_without_data_the_checkpoints_group_is_taken(npy_ckpt: Path, tmp_path: Path) -> None:
    from fasttrain.data.npy import NpyDataModule

    # digits (the default) has the same input shape and classes: once this evaluated on digits
    # (acc ~0.1); then it was refused unless data=npy was typed. The checkpoint names its data;
    # its files are where this machine's conf/ says (data_dir/npy), never where it says.
    here = copy_arrays(npy_ckpt.parent, tmp_path / "data" / "npy")
    _, datamodule = restore(eval_cfg(npy_ckpt, tmp_path))
    assert isinstance(datamodule, NpyDataModule) and datamodule.path == here
    assert len(datamodule.splits["test"]) == 12


def copy_arrays(source: Path, folder: Path) -> Path:
    import shutil

    folder.mkdir(parents=True)
    for name in ("x.npy", "y.npy"):
        shutil.copy(source / name, folder / name)
    return folder


@pytest.mark.slow  # two processes, ~25 s: CI runs it in make test-slow
def test_cli_other_data_typed_is_refused_and_a_typed_path_is_used(
    npy_ckpt: Path, tmp_path: Path
) -> None:
    import shutil

    from conftest import run_cli

    proc = run_cli(["-m", "fasttrain.evaluate", f"ckpt_path={npy_ckpt}", "data=digits"], tmp_path)
    assert proc.returncode == 2
    line = proc.stderr.strip().splitlines()[-1]
    assert "trained on fasttrain.data.npy.NpyDataModule data, but data= selects" in line
    assert "select its data group: data=npy" in line
    moved = tmp_path / "moved"
    shutil.copytree(npy_ckpt.parent, moved)
    typed = [f"ckpt_path={npy_ckpt}", "data=npy", f"data.path={moved}"]
    proc = run_cli(["-m", "fasttrain.evaluate", *typed], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"data.path={moved}: used instead of the checkpoint's data.path=" in proc.stderr


def test_its_own_data_group_restores_its_split(npy_ckpt: Path, tmp_path: Path) -> None:
    from fasttrain.data.npy import NpyDataModule

    # data.path is not given: it is conf/'s (never the checkpoint's); the seed and fractions
    # come from the checkpoint
    here = copy_arrays(npy_ckpt.parent, tmp_path / "data" / "npy")
    _, datamodule = restore(eval_cfg(npy_ckpt, tmp_path, "data=npy"))
    assert isinstance(datamodule, NpyDataModule)
    assert datamodule.path == here
    assert len(datamodule.splits["test"]) == 12  # 10% of 120


def test_evaluate_refuses_in_one_line_and_writes_nothing(
    npy_ckpt: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    from fasttrain.evaluate import main

    argv = [f"ckpt_path={npy_ckpt}", f"paths.log_dir={tmp_path / 'logs'}", "data.num_workers=0",
            "data=digits"]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["evaluate", *argv])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2
    assert err[-1].startswith("error: ") and "data=npy" in err[-1]
    assert not any("Traceback" in line for line in err)
    assert not list((tmp_path / "logs").rglob("*.yaml"))


def test_a_checkpoint_without_the_record_loads_as_before(npy_ckpt: Path, tmp_path: Path) -> None:
    ckpt = torch.load(npy_ckpt, weights_only=True)
    del ckpt["datamodule_target"]
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    model, datamodule = restore(eval_cfg(old, tmp_path, "data=npy", f"data.path={npy_ckpt.parent}"))
    assert datamodule.path == npy_ckpt.parent
    assert model.hparams["num_classes"] == 10
