"""A new project lives for years from its first commit: its own CI (`make test` and `make lint`
on each push and pull request, checked by actionlint), pre-commit hooks that run offline and stop
a tracker key or a .env before it is committed, and a .env.example of the names the trackers
read. This repository's workflow and hooks are held to the same. The project is the session's
(conftest.py); a test that commits works on a clone of it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from fasttrain.tools.new_project import SCAFFOLD, read_record

WORKFLOW = ".github/workflows/ci.yml"
IDENT = ["-c", "user.name=test", "-c", "user.email=test@localhost"]
FAKE_WANDB_KEY = "0123456789abcdef" * 2 + "01234567"  # 40 hex digits, made here: never committed


def actionlint() -> str:
    """The actionlint of this Python's environment (the dev extra), else one on PATH."""
    beside = Path(sys.executable).with_name("actionlint")
    found = str(beside) if beside.is_file() else shutil.which("actionlint")
    if found is None:
        pytest.skip("actionlint is not installed (pip install -e '.[dev]')")
    return found


def lint_workflow(root: Path, text: str | None = None) -> subprocess.CompletedProcess:
    """actionlint on `root`'s workflow (or on `text`, read as that file)."""
    args = [actionlint(), "-no-color"]
    args += [WORKFLOW] if text is None else ["-stdin-filename", WORKFLOW, "-"]
    return subprocess.run(args, cwd=root, input=text, capture_output=True, text=True, timeout=60)


def setup_python(workflow: dict) -> dict:
    (job,) = workflow["jobs"].values()
    (step,) = [s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python@")]
    return step["with"]


@pytest.mark.parametrize("root", ["new project", "this repository"])
def test_the_ci_workflow_is_actionlint_clean_and_caches_pip(root: str, new_project: Path) -> None:
    folder = new_project if root == "new project" else REPO
    proc = lint_workflow(folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = (folder / WORKFLOW).read_text()
    broken = text.replace("python-version:", "python-versoin:", 1)  # the check is no formality
    assert broken != text and lint_workflow(folder, broken).returncode == 1
    given = setup_python(yaml.safe_load(text))
    assert given["cache"] == "pip"
    assert (folder / given["cache-dependency-path"]).is_file(), given


def test_the_new_projects_ci_runs_make_test_and_make_lint(new_project: Path) -> None:
    workflow = yaml.safe_load((new_project / WORKFLOW).read_text())
    assert set(workflow[True]) == {"push", "pull_request"}  # YAML 1.1 reads `on` as true
    (job,) = workflow["jobs"].values()
    assert [s["run"] for s in job["steps"] if "run" in s] == ["make test", "make lint"]
    assert setup_python(workflow)["python-version"] == read_record(new_project)["python_version"]


def test_env_example_names_the_trackers_keys_and_env_is_ignored(new_project: Path) -> None:
    lines = (new_project / ".env.example").read_text().splitlines()
    names = [line.partition("=")[0] for line in lines if line and not line.startswith("#")]
    assert {"WANDB_API_KEY", "WANDB_ENTITY", "MLFLOW_TRACKING_USERNAME",
            "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_URI"} <= set(names)  # fmt: skip
    assert all(line.endswith("=") for line in lines if line.partition("=")[0] in names)
    ignored = subprocess.run(["git", "check-ignore", ".env", ".env.example"], cwd=new_project,
                             capture_output=True, text=True)  # fmt: skip
    assert ignored.stdout.split() == [".env"]


@pytest.mark.parametrize("config", [SCAFFOLD, REPO], ids=["scaffold", "this repository"])
def test_pre_commit_hooks_are_local_tools_the_dev_extra_installs(config: Path) -> None:
    repos = yaml.safe_load((config / ".pre-commit-config.yaml").read_text())["repos"]
    assert [r["repo"] for r in repos] == ["local"]  # nothing to download: offline
    for hook in repos[0]["hooks"]:
        tool = hook["entry"].split()[0]
        assert hook["language"] == "system" and tool.startswith(".venv/bin/"), hook
        assert Path(sys.prefix, "bin", Path(tool).name).is_file(), f"{tool}: not in .venv"


def in_clone(project: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A clone of `project` whose .venv is this Python's (the hooks' tools, this fasttrain),
    and the environment pre-commit runs in (its cache under tmp_path, not the user's)."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(project), str(clone)], check=True)
    (clone / ".venv").symlink_to(sys.prefix)
    return clone, {**os.environ, "PRE_COMMIT_HOME": str(tmp_path / "pre-commit")}


def commit(clone: Path, env: dict[str, str], *paths: str) -> tuple[int, str]:
    """git commit of `paths`: its exit code and what the hook said (git shows it on stderr)."""
    subprocess.run(["git", "add", "-f", *paths], cwd=clone, check=True)
    proc = subprocess.run(["git", *IDENT, "commit", "-q", "-m", "x"], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


# pre-commit over the whole project, then two refused commits (~1 s; the render is shared)
def test_pre_commit_passes_offline_and_stops_a_key_and_a_dot_env(
    new_project: Path, tmp_path: Path
) -> None:
    pytest.importorskip("pre_commit")
    clone, env = in_clone(new_project, tmp_path)
    pre_commit = [sys.executable, "-m", "pre_commit"]
    ran = subprocess.run([*pre_commit, "run", "--all-files"], cwd=clone, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "Passed" in ran.stdout and "Failed" not in ran.stdout
    subprocess.run([*pre_commit, "install"], cwd=clone, env=env, check=True, capture_output=True)
    (clone / ".env").write_text(f"WANDB_API_KEY={FAKE_WANDB_KEY}\n")
    code, said = commit(clone, env, ".env")
    assert code != 0 and "\n.env: a .env file holds the real secrets" in said, said
    subprocess.run(["git", "reset", "-q"], cwd=clone, check=True)
    wandb = clone / "conf/logger/wandb.yaml"
    line = len(wandb.read_text().splitlines()) + 1
    wandb.write_text(wandb.read_text() + f"  api_key: {FAKE_WANDB_KEY}\n")
    code, said = commit(clone, env, "conf/logger/wandb.yaml")
    assert code != 0 and f"conf/logger/wandb.yaml:{line}: a W&B API key" in said, said
    assert (
        subprocess.run(
            ["git", "log", "--oneline"], cwd=clone, capture_output=True, text=True
        ).stdout.count("\n")
        == 1
    )  # fmt: skip  (nothing committed)


HOOK_TARGET = "hook: ; @$(HOOK)"  # the Makefile's HOOK alone, as make install runs it


def run_hook(folder: Path) -> subprocess.CompletedProcess:
    make = ["make", "-s", "-f", str(SCAFFOLD / "Makefile"), "--eval", HOOK_TARGET, "hook"]
    return subprocess.run(make, cwd=folder, capture_output=True, text=True, timeout=60)


def test_make_install_installs_the_git_hook_only_at_the_top_of_a_repository(
    tmp_path: Path,
) -> None:
    if shutil.which("make") is None or shutil.which("git") is None:
        pytest.skip("make and git are needed")
    project = tmp_path / "project"
    (project / ".venv" / "bin").mkdir(parents=True)
    stub = project / ".venv" / "bin" / "pre-commit"  # says where it ran, then fails if told to
    stub.write_text('#!/bin/sh\npwd > "$0.ran"\n[ ! -e "$0.fail" ]\n')
    stub.chmod(0o755)
    ran = stub.with_name("pre-commit.ran")
    proc = run_hook(project)  # no repository: a note, never a failed install
    assert proc.returncode == 0 and "note: no git hook installed" in proc.stdout
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)  # a repository above it
    assert run_hook(project).returncode == 0 and not ran.exists()
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    proc = run_hook(project)
    assert proc.returncode == 0 and ran.read_text().strip() == str(project.resolve())
    stub.with_name("pre-commit.fail").touch()
    proc = run_hook(project)
    assert proc.returncode == 0 and "note: pre-commit install failed" in proc.stdout
