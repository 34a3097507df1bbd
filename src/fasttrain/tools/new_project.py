"""Copy this template into a new project under a new package name: the one place that knows how.

    make new-project NAME=acme_vision DEST=../acme_vision
    python src/fasttrain/tools/new_project.py create ../acme_vision --package acme_vision
    copier copy --trust <this repo> ../acme_vision   (copier.yml runs `rename` after copying)

Standard library only, so it runs before any environment exists.
"""

from __future__ import annotations

import argparse
import importlib.util
import keyword
import re
import shutil
import subprocess
import sys
from pathlib import Path

TEMPLATE = "fasttrain"  # the package name this copy carries; `rename` replaces it
# Its distribution name (pyproject, scripts, README title): the package name with hyphens, as
# `rename` writes it, so a generated project can itself be copied again.
TEMPLATE_PROJECT = TEMPLATE.replace("_", "-")
ROOT = Path(__file__).resolve().parents[3]  # src/<package>/tools/new_project.py
# Never copied: run outputs, environments, caches, the template's own history and copier file.
EXCLUDE = {".git", ".venv", "logs", "outputs", "multirun", "lightning_logs", "__pycache__",
           ".pytest_cache", ".ruff_cache", ".mypy_cache", ".ipynb_checkpoints", "build", "dist",
           "copier.yml"}  # fmt: skip
ATTRIBUTION = f"Started from the {TEMPLATE} template."
# README text that only holds in the template (how to copy it with copier, whose copier.yml is
# not copied): between these markers, dropped from a copy's README.
TEMPLATE_ONLY = re.compile(r"\n*<!-- template-only -->.*?<!-- /template-only -->\n*", re.S)


class NewProjectError(Exception):
    """Bad input: reported as one line, before anything is written."""


def check_package(name: str) -> None:
    if not name.isidentifier() or keyword.iskeyword(name) or not name.isascii():
        raise NewProjectError(
            f"package name {name!r} is not a valid Python identifier "
            "(letters, digits and underscores, not starting with a digit), e.g. acme_vision"
        )
    if not re.fullmatch(r"[A-Za-z]([A-Za-z0-9_]*[A-Za-z0-9])?", name):
        raise NewProjectError(
            f"package name {name!r} must start with a letter and end with a letter or digit: "
            "its distribution name (with hyphens) must be a valid project name, e.g. acme_vision"
        )
    own = sorted(p.name for p in ROOT.iterdir() if p.stem == name and not p.name.startswith("."))
    if own:
        raise NewProjectError(
            f"package name {name!r} is the name of the project's own {own[0]} at its top level "
            f"(python train.py would import that instead of the package); choose another name"
        )
    found = importable(name)
    if found:
        raise NewProjectError(
            f"package name {name!r} shadows the importable module {name} ({found}): the new "
            "project could not import both; choose another name, e.g. acme_vision"
        )


def importable(name: str) -> str | None:
    """Where a top-level module `name` is imported from (standard library, a dependency of this
    template, a package installed in this Python), or None. The folder of this script, first on
    sys.path when it runs as a script, is left out: its modules are no project's top level."""
    if name in sys.builtin_module_names or name in getattr(sys, "stdlib_module_names", ()):
        return "standard library"
    if name in dependency_modules(ROOT / "pyproject.toml"):
        return "a dependency in pyproject.toml"
    here = Path(__file__).resolve().parent
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = saved
    return None if spec is None else str(spec.origin or "namespace package")


def dependency_modules(pyproject: Path) -> set[str]:
    """Import names of the `dependencies` in pyproject.toml (without tomllib: Python 3.10)."""
    text = pyproject.read_text(encoding="utf-8") if pyproject.is_file() else ""
    block = re.search(r"^dependencies = \[(.*?)^\]", text, flags=re.M | re.S)
    names = re.findall(r'"([A-Za-z0-9_.-]+)', block.group(1)) if block else []
    renamed = {"hydra-core": "hydra", "scikit-learn": "sklearn"}  # distribution != import name
    return {renamed.get(n.lower(), n.lower().replace("-", "_")) for n in names}


def check_dest(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise NewProjectError(f"destination {dest} exists and is not empty; choose a new folder")


def copy_tree(src: Path, dest: Path) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n in EXCLUDE or n.endswith((".egg-info", ".pyc"))}

    shutil.copytree(src, dest, ignore=ignore, dirs_exist_ok=True)


def _replace(text: str, package: str, project: str) -> str:
    text = re.sub(rf"^# {TEMPLATE_PROJECT}\b", f"# {project}", text, flags=re.M)  # README title
    text = re.sub(rf'^name = "{TEMPLATE_PROJECT}"', f'name = "{project}"', text, flags=re.M)
    text = re.sub(rf"\b{TEMPLATE_PROJECT}-(\w)", rf"{project}-\1", text)  # console scripts
    text = text.replace(TEMPLATE.upper(), package.upper())  # env vars (FASTTRAIN_ROOT)
    return text.replace(TEMPLATE, package)


def rename(root: Path, package: str, project: str, author: str = "", python: str = "") -> None:
    """Rename the package in `root` (a fresh copy): folder, imports, `_target_`s, pyproject,
    README title, Makefile, env var names; then set author and Python version if given."""
    check_package(package)
    old = root / "src" / TEMPLATE
    if old.is_dir():
        old.rename(root / "src" / package)
    for path in sorted(p for p in root.rglob("*") if p.is_file() and ".git" not in p.parts):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary files carry no names
        new = _replace(text, package, project)
        if path.name == "pyproject.toml":
            new = _pyproject(new, author, python)
        if path.name == "README.md" and root / "README.md" == path:
            new = new.replace("\n", f"\n\n{ATTRIBUTION}\n", 1)
            if not (root / "copier.yml").exists():  # no copier template: no copier instructions
                new = TEMPLATE_ONLY.sub("\n\n", new)
        if new != text:
            path.write_text(new, encoding="utf-8")


def _pyproject(text: str, author: str, python: str) -> str:
    if author:
        text = re.sub(r"^(license = .*)$", rf'\1\nauthors = [{{ name = "{author}" }}]', text,
                      count=1, flags=re.M)  # fmt: skip
    if python:
        text = re.sub(r'^requires-python = ".*"', f'requires-python = ">={python}"', text,
                      count=1, flags=re.M)  # fmt: skip
        short = python.replace(".", "")
        text = re.sub(r'^target-version = "py\d+"', f'target-version = "py{short}"', text,
                      flags=re.M)  # fmt: skip
        text = re.sub(r'^python_version = ".*"', f'python_version = "{python}"', text, flags=re.M)
    return text


def git_init(root: Path, message: str) -> None:
    """`git init` and a first commit, under the user's git identity (a neutral one if unset)."""
    if shutil.which("git") is None:
        print("git not found: the project is not a repository yet", file=sys.stderr)
        return
    has_ident = subprocess.run(["git", "config", "user.email"], cwd=root, capture_output=True)
    ident = [] if has_ident.stdout.strip() else [
        "-c", "user.name=new-project", "-c", "user.email=new-project@localhost"]  # fmt: skip
    for args in (["init", "-q"], ["add", "-A"], [*ident, "commit", "-q", "-m", message]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


def create(dest: Path, package: str, project: str = "", author: str = "", python: str = "",
           src: Path = ROOT, init_git: bool = True) -> Path:  # fmt: skip
    """Copy `src` to `dest` and rename it; refuse bad names or a non-empty `dest` first."""
    check_package(package)
    dest = dest.resolve()
    check_dest(dest)
    copy_tree(src, dest)
    rename(dest, package, project or package.replace("_", "-"), author, python)
    if init_git:
        git_init(dest, f"New project {package}, from the {TEMPLATE} template")
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("create", "rename"):
        cmd = sub.add_parser(name)
        cmd.add_argument("dest" if name == "create" else "root", type=Path)
        cmd.add_argument("--package", required=True, help="Python package name, e.g. acme_vision")
        cmd.add_argument("--project", default="", help="distribution name (default: package)")
        cmd.add_argument("--author", default="")
        cmd.add_argument("--python", default="", help="minimum Python version, e.g. 3.11")
        cmd.add_argument("--no-git", action="store_true", help="skip git init and first commit")
    args = parser.parse_args(argv)
    try:
        if args.command == "create":
            dest = create(args.dest, args.package, args.project, args.author, args.python,
                          init_git=not args.no_git)  # fmt: skip
            print(f"created {dest}: cd {dest} && make test")
        else:
            project = args.project or args.package.replace("_", "-")
            rename(args.root, args.package, project, args.author, args.python)
            if not args.no_git:
                git_init(args.root, f"New project {args.package}, from the {TEMPLATE} template")
    except NewProjectError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
