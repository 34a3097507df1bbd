"""CI and pre-commit call the Makefile's targets, so a green `make lint test` means a green CI."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-zA-Z_-]+):", (REPO / "Makefile").read_text(), flags=re.M))


def test_ci_workflow_runs_makefile_targets_like_ci_run() -> None:
    workflow = yaml.safe_load((REPO / ".github/workflows/ci.yml").read_text())
    steps = [s.get("run", "") for job in workflow["jobs"].values() for s in job["steps"]]
    used = {m for step in steps for m in re.findall(r"\bmake (\S+)", step)}
    ci_run = set(re.findall(r"^make (\S+)", (REPO / ".ci/run").read_text(), flags=re.M))
    assert ci_run <= used, "the workflow skips a target that .ci/run runs"
    assert "lint" in used and used <= make_targets()


def test_makefile_has_the_tooling_targets() -> None:
    assert {"lint", "format", "typecheck", "tensorboard", "new-project", "test"} <= make_targets()


def test_pre_commit_runs_make_lints_checks_and_refuses_notebook_outputs() -> None:
    config = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text())
    hooks = {h["id"] for repo in config["repos"] for h in repo["hooks"]}
    assert {"ruff", "ruff-format", "mypy", "notebooks", "secrets"} <= hooks


def test_ci_runs_the_readme_commands_with_nothing_pre_installed() -> None:
    readme = (REPO / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    readme_commands = re.findall(r"^(make \S+)", first_block, flags=re.M)
    ci_run = (REPO / ".ci/run").read_text()
    ci_commands = re.findall(r"^(make \S+)", ci_run, flags=re.M)
    assert readme_commands == ["make train", "make test"]
    assert ci_commands[:2] == readme_commands  # first, and in the README's order
    assert not re.search(r"pip install|python3? -m venv", ci_run)  # the Makefile does that


@pytest.mark.parametrize("folder", ["", "src/fasttrain/tools/scaffold"], ids=["repo", "project"])
def test_make_tensorboard_serves_the_folder_runs_go_to(folder: str, tmp_path: Path) -> None:
    """FASTTRAIN_ROOT moves logs/ (conf/paths); `make tensorboard` serves that one, not the
    launch folder's (empty) logs/. Read from `make -n`: what it would run."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    root = tmp_path / "a root"
    for value, logs in (("", "logs"), ("  ", "logs"), (str(root), f"{root}/logs")):
        env = {**os.environ, "FASTTRAIN_ROOT": value}
        proc = subprocess.run(["make", "-n", "-s", "-o", ".venv/.installed", "tensorboard"],
                              cwd=REPO / folder, env=env, capture_output=True, text=True,
                              check=True)  # fmt: skip
        assert f'--logdir "{logs}" --host 127.0.0.1' in proc.stdout, proc.stdout
