"""One run per run folder at a time: a second `python train.py run_name=R` refuses in one line
while the first holds R; a killed run never leaves R locked; the ranks of one DDP job share it.
And a run refused after Hydra started takes back exactly what it wrote (fasttrain.cli.RunClaim).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from test_reliability_run_names import files_under, main_in
from test_reliability_run_sweeps import train, user_env

from conftest import REPO, wait_for
from fasttrain.cli import LOCK_FILE, RunClaim, first_process
from fasttrain.config.errors import UserError

HOLD = (
    "import sys, time; from pathlib import Path; from fasttrain.cli import RunClaim\n"
    "RunClaim(Path(sys.argv[1])).lock('R'); print('held', flush=True); time.sleep(120)\n"
)


def holder(run_dir: Path) -> subprocess.Popen:
    """Another process holding `run_dir` (as a run does from its start to its end)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], stdout=subprocess.PIPE,
                            text=True)  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def test_second_run_refuses_while_the_first_holds_the_folder(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    run = tmp_path / "logs" / "train" / "R"
    first = holder(run)
    try:
        before = files_under(tmp_path)
        code, err = main_in(tmp_path, ["model=mlp", "run_name=R"], monkeypatch, capsys)
        assert code == 2
        assert err == [
            f"error: run_name=R: another run (pid {first.pid}) is writing to logs/train/R; "
            "wait for it to end, or choose another run_name"
        ]
        assert files_under(tmp_path) == before
    finally:
        first.kill()
        first.wait()


def test_a_killed_run_leaves_no_lock_behind(tmp_path: Path) -> None:
    first = holder(tmp_path / "R")
    with pytest.raises(UserError, match=f"another run \\(pid {first.pid}\\)"):
        RunClaim(tmp_path / "R").lock("R")
    first.send_signal(signal.SIGKILL)
    first.wait()
    claim = RunClaim(tmp_path / "R")
    claim.lock("R")  # the kernel dropped the killed process's lock
    claim.release()


def test_same_process_claims_in_turn(tmp_path: Path) -> None:
    first, second = RunClaim(tmp_path / "R"), RunClaim(tmp_path / "R")
    first.lock("R")
    with pytest.raises(UserError, match="another run"):
        second.lock("R")
    first.release()
    second.lock("R")
    second.release()
    assert (tmp_path / "R" / LOCK_FILE).read_text().strip() == str(os.getpid())


@pytest.mark.parametrize("var", ["RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID"])
def test_only_the_first_process_of_a_job_claims(var: str, monkeypatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID"):
        monkeypatch.setenv(name, "0")
    assert first_process()  # torchrun's and SLURM's rank 0, Lightning's launching process
    monkeypatch.setenv(var, "1")
    assert not first_process()


def contents(root: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in root.rglob("*")
    }


def test_undo_takes_back_only_what_this_invocation_wrote(tmp_path: Path) -> None:
    run = tmp_path / "logs" / "train" / "R"
    (run / ".hydra").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    (run / ".hydra" / "overrides.yaml").write_text("- run_name=R\n")
    (run / "train.log").write_text("old line\n")
    (run / "checkpoints" / "last.ckpt").write_bytes(b"weights")
    before = contents(tmp_path)
    claim = RunClaim(run)
    claim.lock("R")
    # what Hydra and a run refused on bad input write before the refusal
    (run / ".hydra" / "overrides.yaml").write_text("- run_name=R\n- model=cnn\n")
    (run / ".hydra" / "config.yaml").write_text("new\n")
    with (run / "train.log").open("a") as log:
        log.write("new line\n")
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events").write_bytes(b"new")
    claim.undo()
    claim.release()
    assert contents(tmp_path) == before


def test_undo_removes_a_run_folder_it_created(tmp_path: Path) -> None:
    claim = RunClaim(tmp_path / "logs" / "train" / "R")
    claim.lock("R")
    (tmp_path / "logs" / "train" / "R" / ".hydra").mkdir()
    (tmp_path / "logs" / "train" / "R" / "train.log").write_text("x")
    claim.undo()
    claim.release()
    assert files_under(tmp_path) == []


def test_undo_puts_back_a_run_moved_aside(tmp_path: Path) -> None:
    run = tmp_path / "R"
    run.mkdir()
    (run / "metrics.json").write_text("{}")
    claim = RunClaim(run)
    claim.lock("R")
    claim.move_aside("R")
    assert claim.moved is not None and claim.moved[1].name.startswith("R.replaced-")
    assert (claim.moved[1] / "metrics.json").is_file() and files_under(run) == [LOCK_FILE]
    (run / "train.log").write_text("the new run's")
    claim.undo()
    claim.release()
    assert files_under(tmp_path) == ["R", f"R/{LOCK_FILE}", "R/metrics.json"]


@pytest.mark.slow
def test_two_real_runs_with_one_run_name(tmp_path: Path) -> None:
    """Two `python train.py run_name=R` at once: the second refuses, the first runs on."""
    args = ["model=mlp", "data.num_workers=0", "logger=none", "test=false", "data.batch_size=8",
            "trainer.max_epochs=1000", "callbacks.progress_bar=null", "run_name=R"]  # fmt: skip
    first = subprocess.Popen(
        [sys.executable, str(REPO / "train.py"), *args], cwd=tmp_path, env=user_env(),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        last = tmp_path / "logs" / "train" / "R" / "checkpoints" / "last.ckpt"
        wait_for(last.exists, 300, "the first run saving last.ckpt", first)
        second = train(args, tmp_path)
        assert second.returncode == 2
        assert second.stderr.strip().splitlines() == [
            f"error: run_name=R: another run (pid {first.pid}) is writing to logs/train/R; "
            "wait for it to end, or choose another run_name"
        ]
        assert first.poll() is None  # still running, undisturbed
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        first.kill()
        first.wait()


@pytest.mark.slow
def test_ddp_cpu_ranks_share_the_run_folder(tmp_path: Path) -> None:
    # Lightning re-runs the script for rank 1 (LOCAL_RANK=1): it must not refuse rank 0's folder.
    proc = train(["trainer=ddp_cpu", "model=mlp", "debug=limit", "logger=none", "run_name=D"],
                 tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "another run" not in proc.stderr
    assert (tmp_path / "logs" / "train" / "D" / "metrics.json").is_file()


def test_a_given_paths_output_dir_is_the_run_folder_and_is_held(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """paths.output_dir=X names the run's folder: its lock, .hydra/ and log are there, no second
    folder appears under logs/, and a second run given X refuses while the first holds it."""
    from fasttrain.config.project import shown

    out = tmp_path / "elsewhere" / "run"
    first = holder(out)
    try:
        before = files_under(tmp_path)
        code, err = main_in(tmp_path, ["model=mlp", f"paths.output_dir={out}"], monkeypatch, capsys)
        assert code == 2
        assert err == [
            f"error: paths.output_dir={out}: another run (pid {first.pid}) is writing to "
            f"{shown(out)}; wait for it to end, or choose another paths.output_dir"
        ]
        assert files_under(tmp_path) == before
    finally:
        first.kill()
        first.wait()
    proc = train(["debug=fast_dev_run", f"paths.output_dir={out}"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {"metrics.json", "train.log", ".hydra", LOCK_FILE} <= {p.name for p in out.iterdir()}
    assert not (tmp_path / "logs").exists(), files_under(tmp_path / "logs")


def test_a_sweep_into_one_paths_output_dir_is_refused(tmp_path: Path) -> None:
    """Every job would write its checkpoints over the one before's: one line, nothing written;
    a folder that differs per job (${hydra:job.num}) sweeps."""
    proc = train(["-m", "debug=fast_dev_run", "seed=1,2", f"paths.output_dir={tmp_path}/out"],
                 tmp_path)  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: paths.output_dir={tmp_path}/out: every job of the sweep")
    assert "${hydra:job.num}" in line and files_under(tmp_path) == []
    per_job = f"paths.output_dir={tmp_path}/out/${{hydra:job.num}}"
    proc = train(["-m", "debug=fast_dev_run", "seed=1,2", per_job], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out" / "0" / "metrics.json").is_file()
    assert (tmp_path / "out" / "1" / "metrics.json").is_file()


@pytest.mark.parametrize(("value", "said"), [
    ("", "paths.output_dir='': is empty; expected a folder (made if missing)"),
    ("{file}", "paths.output_dir='{file}': is a file; expected a folder (made if missing)"),
    ("{file}/run", "lies under a file ({file}); expected a folder (made if missing)"),
    ("/proc/fasttrain-run", "paths.output_dir='/proc/fasttrain-run': cannot be made (No such "
                            "file or directory); expected a folder (made if missing)"),
])  # fmt: skip
def test_a_paths_output_dir_that_cannot_be_a_folder_is_one_line(
    value: str, said: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    if value.startswith("/proc") and not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    file = tmp_path / "a-file"
    file.write_text("not a folder")
    before = files_under(tmp_path)
    argv = ["model=mlp", f"paths.output_dir={value.format(file=file)}"]
    code, err = main_in(tmp_path, argv, monkeypatch, capsys)
    assert code == 2 and len(err) == 1 and err[0].endswith(said.format(file=file)), err
    assert files_under(tmp_path) == before


@pytest.mark.parametrize("key", ["log_dir", "data_dir", "root_dir"])
@pytest.mark.parametrize("value", ["", "{file}", "{file}/logs", "/proc/fasttrain-logs/x"],
                         ids=["empty", "file", "under", "unmakeable"])  # fmt: skip
def test_a_paths_folder_that_cannot_be_one_is_refused_before_anything_is_written(
    key: str, value: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    # Before: paths.log_dir= (empty) made the run folder /train/<name>/ at the file system's
    # root, and a file there was a traceback after the run had begun.
    if value.startswith("/proc") and not Path("/proc").is_dir():
        pytest.skip("no /proc here")
    file = tmp_path / "a-file"
    file.write_text("not a folder")
    before = files_under(tmp_path)
    given = value.format(file=file)
    code, err = main_in(tmp_path, ["model=mlp", f"paths.{key}={given}"], monkeypatch, capsys)
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: paths.{key}=") and "expected a folder" in err[0], err
    assert files_under(tmp_path) == before
    assert not Path("/train").exists()
