"""The template as a git repository and a project's record of it: what `make new-project`
(fasttrain.tools.new_project) and `make update-template` (fasttrain.tools.template_update)
both need: git and copier run with one-line errors, the template's commit, copier's answers.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

TEMPLATE = "fasttrain"  # the library's package name
ROOT = Path(__file__).resolve().parents[3]  # src/fasttrain/tools/template_git.py
SCAFFOLD = ROOT / "src" / TEMPLATE / "tools" / "scaffold"  # copier.yml's _subdirectory
RECORD = ".copier-answers.yml"  # in a new project: the scaffold's source and commit
WHEELS = "wheels"  # in a new project: the pinned fasttrain, installed offline


class NewProjectError(Exception):
    """Bad input: reported as one line, before anything is written."""


def git_identity(root: Path) -> list[str]:
    """The user's git identity where set, else a neutral one (git refuses to commit without)."""
    has_ident = subprocess.run(["git", "config", "user.email"], cwd=root, capture_output=True)
    if has_ident.stdout.strip():
        return []
    return ["-c", "user.name=new-project", "-c", "user.email=new-project@localhost"]


def git(root: Path, *args: str) -> str:
    """Run git in `root`; its output. NewProjectError with git's last line if it fails."""
    proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise NewProjectError(f"git {args[0]} failed: {said[-1] if said else proc.returncode}")
    return proc.stdout


def template_commit(src: Path) -> str:
    """The commit the template in `src` is at; "" where `src` is not the top of a git checkout
    with a commit (an unpacked archive; a folder inside another repository, whose HEAD is not
    the template's)."""
    if shutil.which("git") is None:
        return ""
    proc = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=src,
                          capture_output=True, text=True)  # fmt: skip
    lines = proc.stdout.splitlines()
    if proc.returncode != 0 or len(lines) != 2 or Path(lines[0]).resolve() != src.resolve():
        return ""
    return lines[1]


def git_paths(root: Path, *args: str) -> list[str]:
    """The paths a git command lists (with -z, right after the command: any name, unquoted)."""
    return [p for p in git(root, args[0], "-z", *args[1:]).split("\0") if p]


def copier_command() -> list[str]:
    if importlib.util.find_spec("copier") is None:
        raise NewProjectError("copier is not installed in this Python: make install (or "
                              "pip install -e '.[template]'), then again")  # fmt: skip
    return [sys.executable, "-m", "copier"]


def template_url(src: Path) -> str:
    """copier's source for `src`: through git where it is a checkout, so the copy is its commit
    (copier copies a dirty local checkout's uncommitted changes), else the folder as it is."""
    return f"git+file://{src.resolve()}" if template_commit(src) else str(src.resolve())


def copier(args: list[str], cwd: Path | None = None) -> None:
    proc = subprocess.run([*copier_command(), *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise NewProjectError(f"copier {args[0]} failed: {_reason(proc)}")


def _reason(proc: subprocess.CompletedProcess) -> str:
    """The line that says why: a task's own `error: ...`, else copier's last on stderr (a task's
    stdout, e.g. `built ...` of a render that worked, says nothing about the failure)."""
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    ours = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    return (ours or lines or [str(proc.returncode)])[-1]


def answers_args(answers: dict[str, str]) -> list[str]:
    return [arg for key, value in answers.items() for arg in ("-d", f"{key}={value}")]


def read_record(root: Path) -> dict[str, str]:
    """The answers copier recorded (flat `key: value` lines)."""
    record = root / RECORD
    if not record.is_file():
        raise NewProjectError(f"no {RECORD} in {root}: not a project made from {TEMPLATE}")
    pairs = re.findall(r"^(\w+): ?(.*)$", record.read_text(encoding="utf-8"), flags=re.M)
    return {key: value.strip().strip("'\"") for key, value in pairs}
