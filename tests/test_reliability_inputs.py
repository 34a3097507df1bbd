"""Inputs that used to run and mislead, or crash after Hydra made a folder: a training run with
no training batch (it tested the untrained model as the run's result), and predict/export with
an output_dir that is a file. Each is one `error:` line, exit 2, nothing written."""

from __future__ import annotations

import sys
import typing
from pathlib import Path

import pytest

from conftest import run_cli
from fasttrain.config import settings
from fasttrain.config.domains import path_rule_of
from fasttrain.config.errors import UserError


def refused(entry: str, argv: list[str], monkeypatch, capsys) -> str:
    """Run `python -m fasttrain.<entry> argv` in this process; its one error line."""
    import importlib

    main = importlib.import_module(f"fasttrain.{entry}").main
    monkeypatch.setattr(sys, "argv", [entry, *argv])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2, err
    assert not any("Traceback" in line for line in err), err
    assert len([line for line in err if line.startswith("error: ")]) == 1, err
    return err[-1]


def nothing_under(folder: Path) -> bool:
    return not folder.exists() or not any(folder.iterdir())


@pytest.mark.parametrize("limit", ["0", "0.0"])
def test_training_on_no_batch_is_refused(limit: str, tmp_path: Path, monkeypatch, capsys) -> None:
    logs = tmp_path / "logs"
    argv = ["model=mlp", f"trainer.limit_train_batches={limit}", f"paths.log_dir={logs}"]
    line = refused("train", argv, monkeypatch, capsys)
    assert line.startswith(f"error: trainer.limit_train_batches={limit}: no training batch")
    assert "train=false" in line
    assert nothing_under(logs)


def test_train_false_may_test_the_untrained_model() -> None:
    # What the refusal points to stays possible; and a few batches are fine.
    no_batches = {"limit_train_batches": 0}
    settings.check_training_batches(train=False, trainer=no_batches)
    settings.check_training_batches(train=True, trainer={"limit_train_batches": 2})
    settings.check_training_batches(train=True, trainer={"limit_train_batches": 0.25})
    with pytest.raises(UserError, match="limit_train_batches=0"):
        settings.check_training_batches(train=True, trainer=no_batches)


@pytest.mark.parametrize("max_time", ["00:00:00:00", " 0:0:0:0 ", "00:00:-01:00", {"minutes": 0},
                                      {"hours": -1, "minutes": 30}])  # fmt: skip
def test_a_max_time_of_no_time_is_refused(max_time: typing.Any) -> None:
    # Lightning's Timer would stop at its first check and the run test that model.
    with pytest.raises(UserError, match=r"trainer.max_time=.*: training would stop at once"):
        settings.check_training_batches(train=True, trainer={"max_time": max_time})
    settings.check_training_batches(train=False, trainer={"max_time": max_time})


@pytest.mark.parametrize("max_time", [None, "00:00:00:01", "00:12:00:00", {"seconds": 30},
                                      "12:00", "abc", {"weeks": "x"}])  # fmt: skip
def test_a_max_time_with_time_in_it_or_lightnings_to_refuse_passes(max_time: typing.Any) -> None:
    # a malformed one ("12:00", "abc") is Lightning's to refuse, with the format it takes
    settings.check_training_batches(train=True, trainer={"max_time": max_time})


def test_a_zero_max_time_on_the_command_line_is_one_line(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    logs = tmp_path / "logs"
    argv = ["model=mlp", "trainer.max_time=00:00:00:00", f"paths.log_dir={logs}"]
    line = refused("train", argv, monkeypatch, capsys)
    assert line.startswith("error: trainer.max_time=00:00:00:00: training would stop")
    assert nothing_under(logs)


@pytest.mark.parametrize("entry", ["predict", "export"])
@pytest.mark.parametrize("under", [False, True], ids=["a file", "under a file"])
def test_an_output_dir_that_is_a_file_is_refused(
    entry: str, under: bool, tmp_path: Path, monkeypatch, capsys
) -> None:
    file = tmp_path / "taken"
    file.write_text("not a folder")
    out = file / "sub" if under else file
    logs = tmp_path / "logs"
    argv = ["ckpt_path=any.ckpt", f"output_dir={out}", f"paths.log_dir={logs}"]
    line = refused(entry, argv, monkeypatch, capsys)
    assert line.startswith(f"error: output_dir='{out}': ")
    assert "expected a folder" in line
    assert file.read_text() == "not a folder"
    assert nothing_under(logs)


@pytest.mark.parametrize("entry", ["predict", "export"])
def test_an_output_dir_that_cannot_be_made_is_refused(
    entry: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    # Before: a traceback from mkdir after the checkpoint had loaded and the run folder existed.
    if not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    logs = tmp_path / "logs"
    argv = ["ckpt_path=any.ckpt", "output_dir=/proc/fasttrain-out/x", f"paths.log_dir={logs}"]
    line = refused(entry, argv, monkeypatch, capsys)
    assert line == ("error: output_dir='/proc/fasttrain-out/x': cannot be made (No such file or "
                    "directory); expected a folder (made if missing) or null")  # fmt: skip
    assert nothing_under(logs)


def test_a_folder_that_can_be_made_is_left_unmade_by_the_check(tmp_path: Path) -> None:
    from fasttrain.config.domains import Folder

    folder = tmp_path / "a" / "b" / "c"
    assert Folder().admits(str(folder)) and not (tmp_path / "a").exists()


def test_predict_output_dir_on_the_command_line(mlp_ckpt: Path, tmp_path: Path) -> None:
    # Before: the checkpoint loaded, then a traceback writing into the file, and the run's
    # folder left behind.
    file = tmp_path / "taken.csv"
    file.write_text("x")
    args = ["-m", "fasttrain.predict", f"ckpt_path={mlp_ckpt}", f"output_dir={file}"]
    proc = run_cli([*args, "data.num_workers=0"], tmp_path / "logs")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert lines[-1] == (
        f"error: output_dir='{file}': is a file; expected a folder (made if missing) or null"
    )
    assert not any("Traceback" in line for line in lines)
    assert file.read_text() == "x"
    assert nothing_under(tmp_path / "logs")


def test_a_missing_output_dir_is_fine(tmp_path: Path) -> None:
    rule = path_rule_of(typing.get_type_hints(settings.export, include_extras=True)["output_dir"])
    assert rule is not None
    for fine in (str(tmp_path / "new" / "deeper"), str(tmp_path), None, ""):
        assert rule.admits(fine), fine
    (tmp_path / "f").write_text("x")
    assert not rule.admits(str(tmp_path / "f" / "deeper"))
