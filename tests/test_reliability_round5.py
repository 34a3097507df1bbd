"""Round five from outside the suite: hostile numbers in every numeric value of every entry's
config (refused in one line naming the override, or accepted), and runs that diverge ending
with one `diverged:` line and exit code 3, never as a finished run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, run_cli, run_dirs

HOSTILE = ("nan", "inf", "-1", "0", "1e12")
# Each entry config the way a user picks it: (config name, the choices on its command line).
BASES: dict[str, tuple[str, list[str]]] = {
    "train": ("train", []),
    "gpt": ("train", ["model=gpt", "data=text"]),
    "gpt_modern": ("train", ["model=gpt_modern", "data=text"]),
    "regressor": ("train", ["model=regressor", "data=diabetes"]),
    "cnn": ("train", ["model=cnn"]),
    "mlp": ("train", ["model=mlp"]),
    "synthetic": ("train", ["data=synthetic"]),
    "cifar10": ("train", ["data=cifar10", "data.path={tmp}/cifar10"]),
    "image_folder": ("train", ["data=image_folder", "data.path={tmp}/images"]),
    "shards": ("train", ["data=shards", "data.path={tmp}/shards"]),
    "muon": ("train", ["model=gpt_modern", "data=text", "model/optimizer=muon"]),
    "onecycle": ("train", ["model/scheduler=onecycle"]),
    "digits_cnn": ("train", ["experiment=digits_cnn"]),
    "digits_mlp": ("train", ["experiment=digits_mlp"]),
    "cifar10_resnet18": ("train", ["experiment=cifar10_resnet18", "data.path={tmp}/cifar10"]),
    "eval": ("eval", ["ckpt_path={tmp}/absent.ckpt"]),
    "export": ("export", ["ckpt_path={tmp}/absent.ckpt"]),
    "predict": ("predict", ["ckpt_path={tmp}/absent.ckpt"]),
    "prepare": ("prepare", ["data.path={tmp}/images"]),
}
SAMPLED = ("train", "gpt")  # the default run: these two, one hostile value per leaf


def numeric_leaves(node: Any, path: str = "") -> list[str]:
    """The override path of every int or float the composed config holds (not interpolations,
    not hydra's or paths' own keys)."""
    from omegaconf import DictConfig, OmegaConf

    found: list[str] = []
    for key in node:
        where = f"{path}.{key}" if path else str(key)
        if where in ("hydra", "paths") or OmegaConf.is_interpolation(node, key):
            continue
        value = node[key]
        if isinstance(value, DictConfig):
            found += numeric_leaves(value, where)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found.append(where)
    return found


def outcome(config_name: str, argv: list[str]) -> str:
    """What the CLI does with `argv` before Hydra writes anything: "accepted", or the one-line
    refusal. Any other exception propagates: that is the bug this property looks for."""
    from fasttrain.cli import construct_each, one_line
    from fasttrain.config.errors import UserError
    from fasttrain.config.overrides import check_command_line

    try:
        construct_each(check_command_line(config_name, argv).jobs)
    except UserError as err:
        return one_line(err)
    return "accepted"


def base_argv(name: str, tmp_path: Path) -> tuple[str, list[str]]:
    """The base's command line, with the files its data set reads written under tmp_path."""
    from fasttrain.testing.fake_data import write_cifar10, write_image_folder, write_shards

    config_name, argv = BASES[name]
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    makers = {"cifar10": write_cifar10, "images": lambda p: write_image_folder(p, per_class=4),
              "shards": lambda p: write_shards(p, 10)}  # fmt: skip
    for folder, make in makers.items():
        if f"data.path={tmp_path}/{folder}" in argv and not (tmp_path / folder).exists():
            make(tmp_path / folder)
    return config_name, argv


def check_each(name: str, tmp_path: Path, sample: bool) -> dict[str, str]:
    config_name, argv = base_argv(name, tmp_path)
    from fasttrain.config.overrides import check_command_line

    (job,) = check_command_line(config_name, argv).jobs
    leaves = numeric_leaves(job)
    assert leaves, name
    results: dict[str, str] = {}
    for i, leaf in enumerate(leaves):
        values = (HOSTILE[i % len(HOSTILE)],) if sample else HOSTILE
        for value in values:
            said = outcome(config_name, [*argv, f"{leaf}={value}"])
            if said != "accepted":
                assert "\n" not in said, said
                # it names the override: its last part at least (sweep/derived checks)
                assert leaf.rsplit(".", 1)[-1] in said, (leaf, value, said)
            if value in ("nan", "inf"):  # no argument of any component means them
                assert said != "accepted", f"{leaf}={value} was accepted"
            results[f"{leaf}={value}"] = said
    return results


@pytest.mark.parametrize("name", SAMPLED)
def test_hostile_numbers_are_refused_in_one_line_or_accepted(name: str, tmp_path: Path) -> None:
    results = check_each(name, tmp_path, sample=True)
    assert len(results) >= 20


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BASES))
def test_every_hostile_number_of_every_entry(name: str, tmp_path: Path) -> None:
    results = check_each(name, tmp_path, sample=False)
    refused = [k for k, v in results.items() if v != "accepted"]
    assert refused, name


@pytest.mark.parametrize(
    ("base", "override", "expected"),
    [
        ("train", "model.optimizer.lr=inf", "model.optimizer.lr=inf: expected a finite number"),
        ("train", "model.optimizer.lr=nan", "model.optimizer.lr=nan: expected a finite number"),
        ("train", "model.optimizer.weight_decay=inf", "weight_decay=inf: expected a finite"),
        ("gpt", "model.optimizer.lr=inf", "model.optimizer.lr=inf: expected a finite number"),
        ("gpt", "model.weight_decay=nan", "model.weight_decay=nan: expected a finite number"),
        ("gpt", "model.weight_decay=inf", "model.weight_decay=inf: expected a finite number"),
        ("gpt", "model.weight_decay=-1", "model.weight_decay=-1: expected a number >= 0"),
        ("gpt", "model.scheduler.warmup_steps=-1", "model.scheduler.warmup_steps=-1: expected"),
        ("gpt_modern", "model.net.softcap=inf", "model.net.softcap=inf: expected a finite"),
        ("muon", "model.optimizer.lr=nan", "model.optimizer.lr=nan: expected a finite number"),
        ("train", "model.scheduler.eta_min=-1", "model.scheduler.eta_min=-1: sets an lr of 1"),
        ("onecycle", "model.scheduler.pct_start=2", "model.scheduler.pct_start=2: Expected"),
    ],
)
def test_the_values_that_ended_in_a_traceback_are_refused_naming_the_override(
    base: str, override: str, expected: str, tmp_path: Path
) -> None:
    config_name, argv = base_argv(base, tmp_path)
    said = outcome(config_name, [*argv, override])
    assert expected in said, said


def test_a_nan_inside_a_list_argument_is_refused(tmp_path: Path) -> None:
    said = outcome("train", ["model=gpt", "data=text", "model.optimizer.betas=[0.9,nan]"])
    assert "model.optimizer.betas=[0.9, nan] (holds nan): expected a finite number" in said


def test_a_root_that_is_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.write_text("not a folder")
    proc = run_cli([str(REPO / "train.py")], tmp_path / "logs", FASTTRAIN_ROOT=str(root))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"error: FASTTRAIN_ROOT={root}: is a file; expected a folder (made if missing), or unset it"
    ]
    assert root.read_text() == "not a folder"


def diverged_line(proc: Any) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert lines[-1].startswith("diverged: "), lines[-5:]
    assert not [line for line in lines if "Traceback" in line or "Error executing" in line]
    assert "final metrics" not in proc.stdout and "next" not in proc.stdout.lower()
    return lines[-1]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        # one epoch of two batches: the gradients stay finite, validation's loss does not
        (
            ["model.optimizer.lr=1e12", "trainer.max_epochs=1", "trainer.limit_train_batches=2"],
            "the run diverged and has not trained",
        ),
        # one step: a finite val/loss of ~1e8, an inf perplexity
        (
            ["model=gpt", "data=text", "model.weight_decay=1e12", "debug=fast_dev_run"],
            "val/ppl=inf",
        ),
    ],
    ids=["classifier-lr", "gpt-weight-decay"],
)
def test_a_run_that_diverges_ends_with_exit_3_and_no_result(
    args: list[str], says: str, tmp_path: Path
) -> None:
    log_dir = tmp_path / "logs"
    run = ["train.py", *args, "trainer.limit_val_batches=2", "data.num_workers=0", "logger=none"]
    line = diverged_line(run_cli(run, log_dir))
    assert says in line and "model.optimizer.lr" in line
    (run_dir,) = run_dirs(log_dir)
    assert not (run_dir / "metrics.json").exists()
    assert not [p for p in run_dir.rglob("*.ckpt") if "nan" in p.name or "inf" in p.name]


def test_the_guards_gradient_error_is_one_line_and_exit_3(monkeypatch, capsys) -> None:
    from fasttrain.callbacks.grad_health import NonFiniteGradientError
    from fasttrain.cli import DIVERGED_EXIT, run_task

    def task() -> None:
        raise NonFiniteGradientError("non-finite gradient at step 1 in net.fc.weight:\n lower it")

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as exit_:
        run_task(task)
    assert exit_.value.code == DIVERGED_EXIT == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["diverged: non-finite gradient at step 1 in net.fc.weight: lower it"]


def test_held_out_metrics_that_are_finite_pass_and_any_non_finite_one_is_named() -> None:
    import torch

    from fasttrain.callbacks.grad_health import check_held_out_metrics
    from fasttrain.config.errors import DivergedError

    fine = {"val/loss": torch.tensor(2.0), "val/ppl": 7.4, "train/loss": float("nan")}
    check_held_out_metrics(fine, "val", 10)  # a training loss is the guard's business
    with pytest.raises(DivergedError, match=r"^test/acc=nan at step 4"):
        check_held_out_metrics({"test/loss": 1.0, "test/acc": float("nan")}, "test", 4)


def test_the_exit_codes_are_documented() -> None:
    from fasttrain import cli

    assert "3 diverged" in (cli.__doc__ or "")
    docs = "\n".join(p.read_text() for p in [REPO / "README.md", *(REPO / "docs").glob("*.md")])
    assert "exit code 3" in docs or "exit 3" in docs, "the diverged exit code is not in the docs"


if __name__ == "__main__":  # a quick look at one base: python tests/test_reliability_round5.py gpt
    import tempfile

    for case, said in check_each(sys.argv[1], Path(tempfile.mkdtemp()), sample=False).items():
        print(f"{case:50} {said}")


# ---- Ctrl-C outside fit -----------------------------------------------------------------------
# The entry's task replaced by one that sends the process a real SIGINT (the terminal's Ctrl-C),
# through the real handler, Hydra's job and `script`; `swallowed`: a library that catches the
# KeyboardInterrupt and raises its own error instead (onnxruntime's import does).
CTRL_C_TASK = """
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal starts it
import fasttrain.tasks as tasks

def interrupted(cfg):
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)
    except KeyboardInterrupt:
        if sys.argv[2] == "swallowed":
            raise ImportError("initialization failed") from None
        raise

setattr(tasks, {task!r}, interrupted)
from fasttrain.cli import entry_points
_, run = entry_points({entry!r}, interrupted)
sys.argv[1:] = [sys.argv[1], "data.num_workers=0"]
run()
"""


@pytest.mark.parametrize("how", ["plain", "swallowed"])
@pytest.mark.parametrize(("entry", "task", "left"), [
    ("eval", "evaluate", "no metrics written"),
    ("export", "export", "no file or report written"),
    ("predict", "predict", "no predictions written"),
])  # fmt: skip
def test_ctrl_c_in_evaluate_export_predict_is_one_line_and_exit_130(
    entry: str, task: str, left: str, how: str, mlp_ckpt: Path, tmp_path: Path
) -> None:
    import subprocess

    code = CTRL_C_TASK.format(task=task, entry=entry)
    proc = subprocess.run(
        [sys.executable, "-c", code, f"ckpt_path={mlp_ckpt}", how, f"paths.log_dir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 130, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith(f"stopped by Ctrl-C: {left}"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr


def test_ctrl_c_during_an_export_leaves_the_folder_as_it_was(
    mlp_ckpt: Path, tmp_path: Path
) -> None:
    """A Ctrl-C while the written files are being checked: no file that no check has read, and
    an earlier export's files and the report that vouches for them unchanged."""
    from hydra import compose, initialize_config_dir

    from conftest import CONF
    from fasttrain.assemble.restore import restore
    from fasttrain.deploy import EXPORTERS, Tolerance, export_and_verify

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        overrides = [f"ckpt_path={mlp_ckpt}", "data.num_workers=0", f"paths.root_dir={tmp_path}",
                     f"paths.output_dir={tmp_path}/run"]  # fmt: skip
        cfg = compose("export", overrides=overrides)
    model, datamodule = restore(cfg)
    example = next(iter(datamodule.test_dataloader()))[0]
    out = tmp_path / "export"

    def exported(batches: Any) -> dict:
        return export_and_verify(model.net, model, [EXPORTERS["torchscript"]], example, batches,
                                 out, __import__("torch").device("cpu"), Tolerance(),
                                 latency_time=0.01)  # fmt: skip

    exported(datamodule.test_dataloader())
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(before) == {EXPORTERS["torchscript"].filename, "export_report.json"}

    def ctrl_c_midway() -> Any:
        batches = iter(datamodule.test_dataloader())
        yield next(batches)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        exported(ctrl_c_midway())
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no hidden file either
    fresh = tmp_path / "fresh"
    with pytest.raises(KeyboardInterrupt):
        export_and_verify(model.net, model, [EXPORTERS["torchscript"]], example, ctrl_c_midway(),
                          fresh, __import__("torch").device("cpu"), Tolerance(),
                          latency_time=0.01)  # fmt: skip
    assert not fresh.exists()  # the folder it made, gone with it


# ---- a full disk, a failed sweep job ----------------------------------------------------------
TESTS = str(Path(__file__).parent)
SHORT_RUN = ["model=mlp", "data.num_workers=0", "data.batch_size=128", "trainer.max_epochs=2",
             "callbacks.checkpoint.every_n_train_steps=3", "callbacks.progress_bar=null",
             "test=false", "logger=none"]  # fmt: skip


def killer(at_step: int, mode: str) -> list[str]:
    return ["+callbacks.killer._target_=killer.Killer", f"+callbacks.killer.at_step={at_step}",
            f"+callbacks.killer.mode={mode}"]  # fmt: skip


def test_a_full_disk_is_one_line_naming_the_file_and_the_command_that_continues(
    tmp_path: Path,
) -> None:
    import torch

    proc = run_cli(["train.py", *SHORT_RUN, "run_name=R", *killer(4, "disk_full")], tmp_path,
                   PYTHONPATH=TESTS)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1]
    checkpoints = tmp_path / "train" / "R" / "checkpoints"
    assert line.startswith(f"error: the disk is full writing {checkpoints}/"), line
    assert "(No space left on device): free some space, or set paths.log_dir" in line
    assert f"the newest checkpoint is {checkpoints}/last.ckpt" in line and "run_name=R" in line
    # the save that failed left its complete predecessor and no temporary file
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == 3
    assert sorted(p.name for p in checkpoints.iterdir() if p.name.startswith(".")) == []


def test_a_failed_sweep_jobs_line_gives_the_command_that_continues_it(tmp_path: Path) -> None:
    """A sweep job has no fixed run_name: "resume=auto" finds nothing; the line gives the job's
    own folder, and that command continues the job from the step it failed at."""
    import shlex
    import subprocess

    import torch

    proc = run_cli(["train.py", "-m", "seed=1", *SHORT_RUN, *killer(4, "raise")], tmp_path,
                   PYTHONPATH=TESTS)  # fmt: skip
    assert proc.returncode == 1
    (line,) = [ln for ln in proc.stderr.splitlines() if "the run failed at step 4" in ln]
    assert "saved " in line and "; continue with: " in line, line
    command = shlex.split(line.split("; continue with: ", 1)[1])
    assert "hydra.mode=RUN" in command and any(a.startswith("hydra.run.dir=") for a in command)
    value = next(a for a in command if a.startswith("hydra.run.dir=")).split("=", 1)[1]
    job = Path(value.strip("'"))  # quoted for Hydra's override parser
    job = job if job.is_absolute() else REPO / job
    assert (job / "checkpoints" / "on_exception.ckpt").is_file()
    env = {**__import__("os").environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": TESTS}
    again = subprocess.run([sys.executable, *command[1:]], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Restoring states from the checkpoint path at" in again.stderr + again.stdout
    last = torch.load(job / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 20  # 2 epochs of 10 batches: the job finished


# ---- the accepted hostile values, run -----------------------------------------------------------
# A short run: one epoch of at most 3 steps, the hostile override last (it wins over these; the
# other limit still bounds the run).
SHORT_TRAIN = ["trainer.max_epochs=1", "trainer.max_steps=3", "trainer.limit_train_batches=3",
               "trainer.limit_val_batches=2", "trainer.limit_test_batches=2",
               "data.num_workers=0", "logger=none"]  # fmt: skip


def ran(base: str, override: str, tmp_path: Path) -> str:
    """ "finished" (every metric finite) or "diverged" (DivergedError: the `diverged:` line and
    exit 3 on the command line); anything else propagates."""
    import math

    from practices import compose_train

    from fasttrain.config.errors import DivergedError
    from fasttrain.tasks import train

    _, argv = base_argv(base, tmp_path)
    cfg = compose_train(tmp_path, *argv, *SHORT_TRAIN, override, quick=False)
    try:
        metrics = train(cfg)
    except DivergedError:
        return "diverged"
    assert metrics and all(math.isfinite(v) for v in metrics.values()), (override, metrics)
    return "finished"


def accepted(base: str, tmp_path: Path) -> list[str]:
    return [k for k, v in check_each(base, tmp_path, sample=False).items() if v == "accepted"]


# a sample in the default run: the ones most likely to break a run's end (no "best" to test)
SAMPLED_RUNS = ["callbacks.best.save_top_k=0", "callbacks.checkpoint.save_top_k=0",
                "callbacks.progress_bar.refresh_rate=0", "callbacks.grad_monitor.norm_type=1e12",
                "trainer.max_steps=-1", "trainer.limit_train_batches=1e12"]  # fmt: skip


@pytest.mark.parametrize("override", SAMPLED_RUNS)
def test_an_accepted_hostile_value_runs_to_finite_metrics_or_diverges(
    override: str, tmp_path: Path
) -> None:
    assert outcome("train", [override]) == "accepted"  # else the sample is stale: refresh it
    assert ran("train", override, tmp_path) in ("finished", "diverged")


@pytest.mark.slow
@pytest.mark.parametrize("base", SAMPLED)
def test_every_accepted_hostile_value_runs_to_finite_metrics_or_diverges(
    base: str, tmp_path: Path
) -> None:
    ends = {}
    for i, override in enumerate(accepted(base, tmp_path)):
        ends[override] = ran(base, override, tmp_path / str(i))
    assert "finished" in ends.values(), ends
