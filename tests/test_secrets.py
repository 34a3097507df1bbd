"""Secrets stay out of what a run records and of git: a tracker key comes from the environment or
the project's .env (read once at start-up, never over a variable already set); one given as an
override is refused before anything is written (it would be saved in .hydra/, the tracker's
params and every checkpoint); the pre-commit check (fasttrain.tools.hooks) finds keys and .env
files in what is committed, and none in this repository. Every fake key is built here, never
written literally: the check runs on this file too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_bad_input import assert_nothing_written, refused

from conftest import CONF, REPO, run_cli
from fasttrain.tools import hooks

KEY = "0123456789abcdef" * 2 + "01234567"  # a W&B API key's shape: 40 hex digits
URI = "https://bob" + ":pw@mlflow.example.com"  # a server's URI with a password
REFUSAL = (": a secret given on the command line would be saved in .hydra/config.yaml, the "
           "tracker's params and every checkpoint; put it in the environment or .env (see "
           ".env.example)")  # fmt: skip
SECRETS = [
    "logger.wandb.api_key=not-a-real-key",
    "+logger.mlflow.tracking_password=hunter2",
    "++logger.mlflow.tracking_token='a token'",
    f"+notes={KEY}",  # any key: the value is a W&B key's
    f"logger.mlflow.tracking_uri={URI}",
]


@pytest.mark.parametrize("secret", SECRETS)
def test_a_secret_on_the_command_line_is_refused_before_anything_is_written(
    secret: str, tmp_path: Path, monkeypatch, capsys
) -> None:
    log_dir = tmp_path / "logs"
    err = refused(["logger=many", secret, f"paths.log_dir={log_dir}"], monkeypatch, capsys)
    assert err == [f"error: {secret}{REFUSAL}"]
    assert_nothing_written(log_dir)


def test_a_sweep_of_secrets_is_refused_too(tmp_path: Path, monkeypatch, capsys) -> None:
    log_dir = tmp_path / "logs"
    argv = ["-m", "seed=1,2", "+logger.wandb.api_key=a1b2c3d4,e5f6", f"paths.log_dir={log_dir}"]
    assert refused(argv, monkeypatch, capsys) == [f"error: {argv[2]}{REFUSAL}"]
    assert not log_dir.exists()


HARMLESS = ["+logger.wandb.api_key=null", "+notes=token", f"+notes=logs/{KEY}/last.ckpt",
            "+token_count=3"]  # fmt: skip


@pytest.mark.parametrize("harmless", HARMLESS)
def test_what_is_no_secret_passes(harmless: str) -> None:
    from fasttrain.config.overrides import _parse, refuse_secrets

    refuse_secrets(_parse([harmless]))  # no UserError


def project_with_env(tmp_path: Path, env: str) -> Path:
    """A project folder (conf/ as this checkout's) with a .env."""
    (tmp_path / "conf").symlink_to(CONF)
    (tmp_path / ".env").write_text(env)
    return tmp_path


def test_the_projects_env_file_reaches_the_run_and_a_set_variable_wins(tmp_path: Path) -> None:
    project = project_with_env(tmp_path, "FT_FROM_FILE=from-file\nFT_SET=from-file\nFT_BLANK=\n")
    tags = "tags=[${oc.env:FT_FROM_FILE},${oc.env:FT_SET},${oc.env:FT_BLANK,blank-sets-nothing}]"
    proc = run_cli([str(REPO / "train.py"), "--cfg", "job", "--resolve", tags], tmp_path / "logs",
                   cwd=project, FT_SET="from-the-shell")  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    shown = proc.stdout.split("tags:\n", 1)[1].split("\n")[:3]
    assert shown == ["- from-file", "- from-the-shell", "- blank-sets-nothing"], proc.stdout


def test_without_a_env_file_python_dotenv_is_not_even_imported(tmp_path: Path) -> None:
    (tmp_path / "conf").symlink_to(CONF)
    probe = ("import sys; from fasttrain.config.project import load_env_file; load_env_file(); "
             "print('dotenv' in sys.modules)")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "FASTTRAIN_CONF"}
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.stdout.strip() == "False", proc.stdout + proc.stderr


FOUND = {
    f"WANDB_API_KEY={KEY}\n": "a W&B API key",
    f"  api_key: {KEY}  # wandb\n": "a W&B API key",
    "export WANDB_API_KEY=sk-live-123\n": "a tracker credential",
    "MLFLOW_TRACKING_PASSWORD=hunter2\n": "a tracker credential",
    'os.environ["MLFLOW_TRACKING_TOKEN"] = "abcd' + '1234"\n': "a tracker credential",
    f"tracking_uri: {URI}\n": "a URI with user:password@",
}
NOT_FOUND = [
    "WANDB_API_KEY=\n", "MLFLOW_TRACKING_PASSWORD=  # yours\n", "  api_key: ${oc.env:KEY}\n",
    "api_key: null\n", 'api_key = os.environ["WANDB_API_KEY"]\n', f"commit: {KEY}\n",
    "url: https://<user>:<password>@host\n", "git+ssh://git@example.com/a/b\n",
]  # fmt: skip


@pytest.mark.parametrize("line", [*FOUND, *NOT_FOUND])
def test_the_secrets_hook_finds_keys_and_nothing_else(line: str, tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text(f"# line 1\n{line}")
    expected = [f"{path}:2: {FOUND[line]}"] if line in FOUND else []
    assert [f.split(": put it")[0] for f in hooks.secrets([str(path)])] == expected


def test_the_secrets_hook_refuses_any_env_file_but_its_templates(tmp_path: Path) -> None:
    names = [".env", ".env.local", ".env.example", ".env.sample", "settings.env.md"]
    for name in names:
        (tmp_path / name).write_text("WANDB_API_KEY=\n")
    found = hooks.secrets([str(tmp_path / n) for n in names])
    assert [f.split(": ")[0] for f in found] == [
        str(tmp_path / ".env"),
        str(tmp_path / ".env.local"),
    ]
    assert hooks.main(["secrets", str(tmp_path / ".env")]) == 1
    assert hooks.main(["secrets", str(tmp_path / ".env.example")]) == 0


def test_no_file_of_this_repository_carries_a_key_nor_a_notebook_output() -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split("\0")  # fmt: skip
    files = [str(REPO / f) for f in files if f and (REPO / f).is_file()]
    assert hooks.secrets(files) == []
    assert hooks.notebooks([f for f in files if f.endswith(".ipynb")]) == []


def test_the_notebooks_hook_finds_outputs(tmp_path: Path) -> None:
    cell = {"cell_type": "code", "source": "1", "metadata": {}, "outputs": [],
            "execution_count": None}  # fmt: skip
    clean, ran = tmp_path / "clean.ipynb", tmp_path / "ran.ipynb"
    clean.write_text(json.dumps({"cells": [cell]}))
    ran.write_text(json.dumps({"cells": [{**cell, "execution_count": 1}]}))
    assert [f.split(":")[0] for f in hooks.notebooks([str(clean), str(ran)])] == [str(ran)]
