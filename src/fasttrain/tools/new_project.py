"""Make a new project from this repository, and later take a newer fasttrain into it: the one
place that knows how.

    make new-project NAME=acme_vision DEST=../acme_vision        (in this repository)
    make update-template [FROM=path-or-git-url] [REF=branch-or-commit]   (in the new project)

A new project is thin: the scaffold under src/fasttrain/tools/scaffold/ (conf/, Makefile, train.py,
tests/, notebooks/, one example each of a net, a data set and a task under src/<package>/),
rendered by copier (copier.yml) for the project's names, and the fasttrain library as a wheel
built from the same commit into wheels/, which its pyproject pins by version. The machinery is
never copied: the project installs it. An update is a newer wheel, the pin moved, and `copier
update` of the scaffold: a three-way merge that keeps the project's own edits and files
(fasttrain.tools.template_update). `.copier-answers.yml` records the scaffold's source and commit.

Both render the template as committed (copier reads it through git), never its working tree:
uncommitted edits, untracked and ignored files (.env, data/) of the checkout are no part of it.
"""

from __future__ import annotations

import argparse
import importlib.util
import keyword
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from fasttrain.tools.template_git import (
    RECORD,
    ROOT,
    SCAFFOLD,
    TEMPLATE,
    WHEELS,
    NewProjectError,
    answers_args,
    copier,
    git,
    git_identity,
    template_commit,
    template_url,
)

# Names a package cannot have whatever its folder: the scaffold's .gitignore ignores the folder
# anywhere (src/logs/ would never be committed), and pytest imports any conftest.py as a plugin.
# copier.yml's validator lists the same names.
IGNORED = "is a folder the project's .gitignore ignores (its files would never be committed)"
RESERVED = {
    **dict.fromkeys(["build", "dist", "logs", "outputs", "multirun", "lightning_logs"], IGNORED),
    "conftest": "is pytest's conftest module (pytest would load the package as a plugin)",
}


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
    reserved = RESERVED.get(name)
    if reserved:
        raise NewProjectError(f"package name {name!r} {reserved}; choose another, e.g. acme_vision")
    top = [p.name.removesuffix(".jinja") for p in SCAFFOLD.iterdir()] + [WHEELS]
    own = sorted(n for n in top if Path(n).stem == name and not n.startswith("."))
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
    """Import names of pyproject.toml's `dependencies` (no tomllib: Python 3.10)."""
    text = pyproject.read_text(encoding="utf-8") if pyproject.is_file() else ""
    block = re.search(r"^dependencies = \[(.*?)^\]", text, flags=re.M | re.S)
    names = re.findall(r'"([A-Za-z0-9_.-]+)', block.group(1)) if block else []
    renamed = {"hydra-core": "hydra", "scikit-learn": "sklearn", "python-dotenv": "dotenv"}
    return {renamed.get(n.lower(), n.lower().replace("-", "_")) for n in names}


def check_dest(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise NewProjectError(f"destination {dest} exists and is not empty; choose a new folder")


def note_uncommitted(src: Path, commit: str) -> None:
    """Say so where the checkout differs from what was copied (ignored files aside)."""
    changes = len(git(src, "status", "--porcelain").splitlines())
    if changes:
        print(f"note: copying the template as committed at {commit[:12]}; {changes} uncommitted "
              f"change(s) in {src.resolve()} are not copied", file=sys.stderr)  # fmt: skip


def create(dest: Path, package: str, project: str = "", author: str = "", python: str = "",
           src: Path = ROOT, init_git: bool = True) -> Path:  # fmt: skip
    """Render the scaffold of `src` (as committed) for `package` into `dest`, with its library
    wheel, and make a first commit; refuse bad names or a non-empty `dest` first."""
    check_package(package)
    dest = dest.resolve()
    check_dest(dest)
    commit = template_commit(src)
    if commit:
        note_uncommitted(src, commit)
    answers = {"project_name": project or package.replace("_", "-"), "package_name": package,
               "author": author, "python_version": python or "3.10"}  # fmt: skip
    try:
        copier(["copy", "--trust", "--defaults", "--quiet", "--vcs-ref", "HEAD",
                *answers_args(answers), template_url(src), str(dest)])  # fmt: skip
    except NewProjectError:
        shutil.rmtree(dest, ignore_errors=True)  # nothing half-made is left
        raise
    if init_git:
        git_init(dest, f"New project {package}, from {TEMPLATE}")
    return dest


def build_wheel(src: Path, dest: Path) -> Path:
    """The library of the checkout `src` as a wheel in `dest` (copier.yml's task), in place of
    any older fasttrain wheel there: the one version the project pins. From a git checkout the
    version carries its commit as a local label (0.3.0+g<sha>), which the pin ==0.3.0 matches:
    two commits at one version are two wheels, and the installed metadata names the commit."""
    with tempfile.TemporaryDirectory() as tmp:  # a failed build leaves dest as it was
        tree = labelled_tree(src, Path(tmp) / "src")
        pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", tmp, str(tree)]
        proc = subprocess.run(pip, capture_output=True, text=True)
        built = list(Path(tmp).glob(f"{TEMPLATE}-*.whl"))
        if proc.returncode != 0 or len(built) != 1:
            said = [line for line in proc.stderr.splitlines() if line.strip()]
            raise NewProjectError(f"building the {TEMPLATE} wheel from {src} failed: "
                                  f"{said[-1].strip() if said else proc.returncode}")  # fmt: skip
        dest.mkdir(parents=True, exist_ok=True)
        for old in dest.glob(f"{TEMPLATE}-*.whl"):
            old.unlink()
        return Path(shutil.move(str(built[0]), dest / built[0].name))


def labelled_tree(src: Path, dest: Path) -> Path:
    """A copy of `src` whose pyproject version carries src's commit; `src` itself where it is no
    git checkout (nothing to label) or its version is not a plain static one."""
    commit = template_commit(src)
    pyproject = src / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8") if pyproject.is_file() else ""
    labelled, n = re.subn(r'^(version = "[^"+]+)"', rf'\1+g{commit[:12]}"', text, count=1,
                          flags=re.M)  # fmt: skip
    if not commit or n != 1:
        return src
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".git"), symlinks=True)
    (dest / "pyproject.toml").write_text(labelled, encoding="utf-8")
    return dest


def git_init(root: Path, message: str) -> None:
    """`git init` and a first commit, under the user's git identity (a neutral one if unset):
    copier update merges against the project's history."""
    if shutil.which("git") is None:
        print("git not found: the project is not a repository yet", file=sys.stderr)
        return
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, *git_identity(root), "commit", "-q", "-m", message)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("create", help="make a new project")
    cmd.add_argument("dest", type=Path)
    cmd.add_argument("--package", required=True, help="Python package name, e.g. acme_vision")
    cmd.add_argument("--project", default="", help="distribution name (default: package)")
    cmd.add_argument("--author", default="")
    cmd.add_argument("--python", default="", help="minimum Python version, e.g. 3.11")
    cmd.add_argument("--no-git", action="store_true", help="skip git init and first commit")
    cmd = sub.add_parser("wheel", help="build the library's wheel (copier.yml's task)")
    cmd.add_argument("src", type=Path)
    cmd.add_argument("dest", type=Path)
    cmd = sub.add_parser("update", help="take a newer fasttrain into this project")
    cmd.add_argument("source", nargs="?", default="", help="template path or git URL "
                     f"(default: the one in {RECORD})")  # fmt: skip
    cmd.add_argument("--ref", default="", help="the template's branch or tag (default: its HEAD)")
    cmd.add_argument("--root", type=Path, default=Path("."), help="the project (default: here)")
    args = parser.parse_args(argv)
    from fasttrain.tools.template_update import MergeConflict, update  # its own module

    try:
        if args.command == "create":
            dest = create(args.dest, args.package, args.project, args.author, args.python,
                          init_git=not args.no_git)  # fmt: skip
            print(f"created {dest}: cd {shlex.quote(str(dest))} && make test")  # pasteable
        elif args.command == "wheel":
            print(f"built {build_wheel(args.src, args.dest)}")
        else:
            print(update(args.root.resolve(), args.source, args.ref))
    except MergeConflict as err:  # left to resolve: exit 1, not a refusal
        print(f"error: {err}", file=sys.stderr)
        return 1
    except NewProjectError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
