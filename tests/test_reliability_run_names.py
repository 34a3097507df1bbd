"""Names and numbers that would put a run somewhere else, or nowhere: refused on the command line
in one line, exit 2, and nothing written anywhere (not even the folder a bad name points to)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def main_in(cwd: Path, argv: list[str], monkeypatch, capsys) -> tuple[int, list[str]]:
    """`python train.py <argv>` started in `cwd`, in this process: (exit code, stderr lines)."""
    from fasttrain.train import main

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", [str(REPO / "train.py"), *argv])
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.delenv("FASTTRAIN_ROOT", raising=False)
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("run_name=../../x", "run_name='../../x': expected a folder name inside logs/<task>/"),
        ("run_name=..", "run_name='..': expected a folder name inside logs/<task>/"),
        ("run_name=", "run_name='': expected a folder name inside logs/<task>/"),
        ("run_name=/tmp/elsewhere", "expected a folder name inside logs/<task>/"),
        ("run_name=" + "r" * 300, "expected at most 255 bytes per folder"),
        ("seed=-1", "seed=-1: expected an int from 0 to 4294967295"),
        ("seed=99999999999", "seed=99999999999: expected an int from 0 to 4294967295"),
    ],
    ids=["up_two", "dotdot", "empty", "absolute", "300_chars", "seed_negative", "seed_too_big"],
)
def test_bad_run_name_or_seed_is_one_line_and_writes_nothing(
    override: str, expected: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    # Launched two folders down, so `../../x` would land inside tmp_path: nothing may appear.
    launch = tmp_path / "a" / "b"
    launch.mkdir(parents=True)
    code, err = main_in(launch, ["model=mlp", override], monkeypatch, capsys)
    assert code == 2
    assert len(err) == 1 and err[0].startswith("error: ") and expected in err[0], err
    assert files_under(tmp_path) == ["a", "a/b"]


def test_plain_command_refuses_an_escaping_run_name(tmp_path: Path) -> None:
    """The README's command itself, from an empty folder (no paths.* override)."""
    launch = tmp_path / "a" / "b"
    launch.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("FASTTRAIN_ROOT", "HYDRA_FULL_ERROR")}
    proc = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "run_name=../../x"],
        cwd=launch, env={**env, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: run_name='../../x': expected a folder name inside logs/<task>/"
    ]
    assert files_under(tmp_path) == ["a", "a/b"]
