"""A run's default name: the overrides that differ from the defaults first, keys cut to the
shortest ending that names one setting, then the time to the second (`lr=0.01,seed=1_0131-120005`),
so that the ~25 characters TensorBoard's run list and MLflow's runs table show say what differs.
Two runs started in one minute get two folders; folders named the old way
(`2026-01-31_12-00-00_seed=1`) still resume by name."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
import torch

from conftest import REPO, run_cli

QUICK = ["model=mlp", "data.num_workers=0", "data.batch_size=256", "logger=none", "test=false",
         "callbacks.progress_bar=null", "+trainer.enable_model_summary=false"]  # fmt: skip


def at(monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """Hydra's `${now:...}` reads this time ("2026-01-31 12:00:05")."""
    import hydra.core.utils

    fixed = dt.datetime.fromisoformat(when)

    class Clock(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> dt.datetime:  # type: ignore[override]
            return fixed

    monkeypatch.setattr(hydra.core.utils, "datetime", Clock)


def run_dir(tmp_path: Path, argv: list[str]) -> str:
    """The folder `python train.py <argv>` would use, relative to logs/train/ (nothing run)."""
    from fasttrain.config.overrides import check_command_line

    checked = check_command_line("train", [f"paths.log_dir={tmp_path}", *argv])
    return Path(checked.run_dir).relative_to(tmp_path / "train").as_posix()


def test_a_run_is_named_by_its_overrides_then_its_time(tmp_path, monkeypatch) -> None:
    at(monkeypatch, "2026-01-31 12:00:05")
    assert run_dir(tmp_path, []) == "0131-120005"  # no overrides: the time alone
    assert run_dir(tmp_path, ["seed=1"]) == "seed=1_0131-120005"
    # model.optimizer.lr: the config's one `lr`; max_epochs its one; seed a top-level key.
    named = run_dir(tmp_path, ["model.optimizer.lr=0.01", "seed=1", "trainer.max_epochs=3"])
    assert named == "lr=0.01,seed=1,max_epochs=3_0131-120005"
    assert len("train/" + named.split(",")[0]) < 25  # what differs, first, in the first chars
    # A key given twice names the value that won; a group selection keeps no "/".
    assert run_dir(tmp_path, ["seed=5", "model/optimizer=sgd", "seed=3"]) == (
        "optimizer=sgd,seed=3_0131-120005"
    )
    # data.batch_size is not the config's only batch_size (tuner.batch_size): kept whole.
    assert run_dir(tmp_path, ["data.batch_size=16"]) == "data.batch_size=16_0131-120005"
    # What is not in the config stays as typed.
    assert run_dir(tmp_path, ["+trainer.enable_model_summary=false"]).startswith(
        "+trainer.enable_model_summary=false_"
    )


def test_distinct_overrides_keep_distinct_names(tmp_path, monkeypatch) -> None:
    at(monkeypatch, "2026-01-31 12:00:05")
    given = [["model.optimizer.lr=0.01"], ["model.optimizer.weight_decay=0.01"],
             ["model.optimizer.lr=0.01", "model.optimizer.weight_decay=0.01"],
             ["data.batch_size=32"], ["model=mlp", "model.net.hidden=[32]"],
             ["model=mlp", "model.net.hidden=[32,16]"], ["seed=1"], ["data.seed=1"]]  # fmt: skip
    names = [run_dir(tmp_path, argv) for argv in given]
    assert len(set(names)) == len(names), names


def test_short_keys_cut_only_to_an_ending_that_names_one_setting() -> None:
    from fasttrain.config.resolvers import short_keys

    keys = ["a", "a.x", "a.x.lr", "b", "b.y", "c", "c.lr", "seed", "d", "d.seed"]
    assert short_keys("a.x.lr=1,b.y=[2,3]", keys) == "x.lr=1,y=[2,3]"  # c.lr: lr is not unique
    assert short_keys("d.seed=1,seed=2", keys) == "d.seed=1,seed=2"  # a top-level key: whole
    assert short_keys("+a.new=1,~b.y", keys) == "+a.new=1,~b.y"
    assert short_keys("a.x.lr=1", []) == "a.x.lr=1"  # no config known: as typed


def test_two_quick_runs_of_the_same_overrides_get_two_folders(tmp_path, monkeypatch, capsys):
    """Started 20 s apart, in one minute: two folders, each its own run (the minute alone would
    have put the second into the first's folder, resumed from its checkpoint)."""
    argv = [*QUICK, "debug=fast_dev_run", "seed=1"]
    for when in ("2026-01-31 12:00:05", "2026-01-31 12:00:25"):
        at(monkeypatch, when)
        code, err = main_in(tmp_path, argv, monkeypatch, capsys)
        assert code == 0, err
    folders = sorted(p.name for p in (tmp_path / "logs" / "train").iterdir())
    stem = (
        "+trainer.enable_model_summary=false,progress_bar=null,data.batch_size=256,"
        "num_workers=0,debug=fast_dev_run,logger=none,model=mlp,seed=1,test=false"
    )
    assert len(folders) == 2 and all(re.fullmatch(r"[\w.=,+\[\]-]+_0131-1200[02]5", f)
                                     for f in folders), folders  # fmt: skip
    assert all((tmp_path / "logs" / "train" / f / ".hydra").is_dir() for f in folders)
    assert folders == [f"{stem}_0131-120005", f"{stem}_0131-120025"], folders


def main_in(cwd: Path, argv: list[str], monkeypatch, capsys) -> tuple[int, list[str]]:
    """`python train.py <argv>` started in `cwd`, in this process: (exit code, stderr lines)."""
    import sys

    from fasttrain.train import main

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", [str(REPO / "train.py"), *argv])
    monkeypatch.delenv("FASTTRAIN_ROOT", raising=False)
    try:
        main()
        code = 0
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, capsys.readouterr().err.strip().splitlines()[-5:]


def global_step(run: Path) -> int:
    return int(torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"])


def test_a_folder_named_the_old_way_resumes_by_name(tmp_path, monkeypatch, capsys) -> None:
    """A run folder of the old form, `2026-01-31_12-00-00_seed=1`: `run_name=<it>` continues
    it (resume=auto, the default) from its newest checkpoint, in that folder."""
    old = "2026-01-31_12-00-00_seed=1"
    run = tmp_path / "logs" / "train" / old
    code, err = main_in(tmp_path, [*QUICK, "seed=1", "trainer.max_epochs=1", f"run_name='{old}'"],
                        monkeypatch, capsys)  # fmt: skip
    assert code == 0, err
    first = global_step(run)
    code, err = main_in(tmp_path, [*QUICK, "seed=1", "trainer.max_epochs=2", f"run_name='{old}'"],
                        monkeypatch, capsys)  # fmt: skip
    assert code == 0, err
    assert first > 0 and global_step(run) == 2 * first  # continued: one more epoch, not two
    assert [p.name for p in run.parent.iterdir()] == [old]
    # A new run of the same overrides is a new folder, in the new form; it resumes nothing.
    at(monkeypatch, "2026-01-31 12:00:05")
    code, err = main_in(tmp_path, [*QUICK, "seed=1", "trainer.max_epochs=1"], monkeypatch, capsys)
    assert code == 0, err
    new = sorted(p.name for p in run.parent.iterdir() if p.name != old)
    assert len(new) == 1 and new[0].endswith(",seed=1,test=false,max_epochs=1_0131-120005"), new
    assert global_step(run.parent / new[0]) == first  # from scratch


@pytest.mark.slow
def test_a_sweeps_job_folders_are_the_short_time_then_job_and_overrides(tmp_path: Path) -> None:
    proc = run_cli([str(REPO / "train.py"), "-m", "model.optimizer.lr=0.01,0.1", "seed=1",
                    *QUICK, "debug=fast_dev_run"], tmp_path / "logs")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (sweep,) = (tmp_path / "logs" / "train" / "multirun").iterdir()
    assert re.fullmatch(r"\d{4}-\d{6}", sweep.name), sweep.name
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir())
    assert len(jobs) == 2 and [j.split("_", 1)[0] for j in jobs] == ["0", "1"]
    assert "lr=0.01" in jobs[0].split(",") or ",lr=0.01," in jobs[0], jobs
    assert "lr=0.1" in jobs[1] and "model.optimizer" not in "".join(jobs)
