"""Make a new project from this repository, and later take a newer fasttrain into it: the one
place that knows how. One self-contained module of the standard library on purpose: copier runs
it as a script (copier.yml's task) with the project's own Python, whose installed fasttrain may
be older than this file, so it can import nothing of the package.

    make new-project NAME=acme_vision DEST=../acme_vision        (in this repository)
    make update-template [FROM=path-or-git-url] [REF=branch-or-commit]   (in the new project)

A new project is thin: the scaffold under src/fasttrain/tools/scaffold/ (conf/, Makefile, train.py,
tests/, notebooks/, one example each of a net, a data set and a task under src/<package>/),
rendered by copier (copier.yml) for the project's names, and the fasttrain library as a wheel
built from the same commit into wheels/, which its pyproject pins by version. The machinery is
never copied: the project installs it. An update is a newer wheel, the pin moved, and `copier
update` of the scaffold: a three-way merge that keeps the project's own edits and files.
`.copier-answers.yml` records the scaffold's source and commit.

Both render the template as committed (copier reads it through git), never its working tree:
uncommitted edits, untracked and ignored files (.env, data/) of the checkout are no part of it.
"""

from __future__ import annotations

import argparse
import importlib.util
import keyword
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TEMPLATE = "fasttrain"  # the library's package name
ROOT = Path(__file__).resolve().parents[3]  # src/fasttrain/tools/new_project.py
SCAFFOLD = ROOT / "src" / TEMPLATE / "tools" / "scaffold"  # copier.yml's _subdirectory
RECORD = ".copier-answers.yml"  # in a new project: the scaffold's source and commit
WHEELS = "wheels"  # in a new project: the pinned fasttrain, installed offline


# Names a package cannot have whatever its folder: the scaffold's .gitignore ignores the folder
# anywhere (src/logs/ would never be committed), and pytest imports any conftest.py as a plugin.
# copier.yml's validator lists the same names.
IGNORED = "is a folder the project's .gitignore ignores (its files would never be committed)"
RESERVED = {
    **dict.fromkeys(["build", "dist", "logs", "outputs", "multirun", "lightning_logs"], IGNORED),
    "conftest": "is pytest's conftest module (pytest would load the package as a plugin)",
}


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


def _ident(root: Path) -> list[str]:
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


def _paths(root: Path, *args: str) -> list[str]:
    """The paths a git command lists (with -z, right after the command: any name, unquoted)."""
    return [p for p in git(root, args[0], "-z", *args[1:]).split("\0") if p]


class MergeConflict(NewProjectError):
    """copier left conflicts: the project is mid-update, its changes uncommitted."""


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
    git(root, *_ident(root), "commit", "-q", "-m", message)


def read_record(root: Path) -> dict[str, str]:
    """The answers copier recorded (flat `key: value` lines)."""
    record = root / RECORD
    if not record.is_file():
        raise NewProjectError(f"no {RECORD} in {root}: not a project made from {TEMPLATE}")
    pairs = re.findall(r"^(\w+): ?(.*)$", record.read_text(encoding="utf-8"), flags=re.M)
    return {key: value.strip().strip("'\"") for key, value in pairs}


def update(root: Path, source: str = "", ref: str = "") -> str:
    """Take a newer fasttrain into the project in `root` (see the module doc); what happened, in
    one line. NewProjectError before anything changes if it cannot, and the project restored
    as it was if it fails midway; conflicts are left to resolve (MergeConflict)."""
    record = read_record(root)
    if git(root, "status", "--porcelain", "--untracked-files=no").strip():
        raise NewProjectError("the project has uncommitted changes: commit or stash them first")
    source = source or record.get("_src_path", "")
    if not source:
        raise NewProjectError(f"{RECORD} names no template source: give one, "
                              "make update-template FROM=path-or-git-url")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        checkout = Path(tmp) / "template"
        git(root, "clone", "-q", source.removeprefix("git+"), str(checkout))
        if ref:
            check_out(checkout, source, ref)
        scaffold = SCAFFOLD.relative_to(ROOT)
        if not (checkout / "copier.yml").is_file() or not (checkout / scaffold).is_dir():
            raise NewProjectError(f"{source} is not the {TEMPLATE} template (no copier.yml and "
                                  f"{scaffold} in it)")  # fmt: skip
        commit = git(checkout, "rev-parse", "HEAD").strip()
        if _same_commit(checkout, record.get("_commit", ""), commit):
            return f"already at the template's {commit[:12]}: nothing to update"
        in_the_way = _in_the_way(root, checkout, record)
    if in_the_way:
        raise NewProjectError(f"the template's {commit[:12]} would overwrite {len(in_the_way)} "
                              f"file(s) the project does not track: {_listing(in_the_way)}; "
                              "move them away (or commit them), then again")  # fmt: skip
    untracked = _untracked(root)  # copier refuses to update beside them, and so says less
    if untracked:
        raise NewProjectError(f"the project has {len(untracked)} untracked file(s): "
                              f"{_listing(untracked)}; add them to git or .gitignore (or move "
                              "them away), then again")  # fmt: skip
    url = source if "://" in source or "@" in source else template_url(Path(source))
    head = git(root, "rev-parse", "HEAD").strip()
    try:
        return _land(root, record, url, commit)
    except MergeConflict:
        raise  # left to resolve, as its message says
    except BaseException:
        _restore(root, head)  # a failed update (or ^C) leaves the project as it was
        raise


def check_out(checkout: Path, source: str, ref: str) -> None:
    """The clone at `ref`: a branch (or tag) of the source, or a commit sha."""
    proc = subprocess.run(["git", "checkout", "-q", ref, "--"], cwd=checkout,
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise NewProjectError(f"REF {ref!r} is not a branch, tag or commit of {source}; give one "
                              "it has, e.g. REF=main or a commit sha")  # fmt: skip


def _restore(root: Path, head: str) -> None:
    """The project back at `head`, its working files as committed there. Before the update it
    had no uncommitted changes and no untracked files (ignored ones aside, which git clean
    without -x keeps): whatever else is there now, the update wrote."""
    subprocess.run(["git", "reset", "-q", "--hard", head], cwd=root, capture_output=True)
    subprocess.run(["git", "clean", "-q", "-f", "-d"], cwd=root, capture_output=True)


def _land(root: Path, record: dict[str, str], url: str, commit: str) -> str:
    """copier update to `commit` and its commit; the project's one way of changing. The commit
    skips the project's git hooks: it is the template's files (its CI checked them), and a hook
    refusing one would undo the whole update."""
    if url != record.get("_src_path"):  # copier update takes the source its record names
        _set_source(root, url)
    copier(["update", "--trust", "--defaults", "--quiet", "--conflict", "inline",
            "--vcs-ref", commit], cwd=root)  # fmt: skip
    conflicts = _conflicted(root)
    if conflicts:
        # Staged, the update's new files go with `git reset --hard`; untracked, they would stay
        # and block the next update as files it would overwrite.
        added = _untracked(root)
        if added:
            git(root, "add", "--", *added)
        raise MergeConflict(f"the template's {commit[:12]} conflicts with the project's changes "
                            f"in {_listing(conflicts)}: resolve them, git add them and git "
                            "commit (or git reset --hard to drop the update)")  # fmt: skip
    version = pinned_version(root)
    git(root, "add", "-A")  # nothing was untracked: all of it is the update's
    git(root, *_ident(root), "commit", "-q", "--no-verify", "-m",
        f"{TEMPLATE} {version}, the template at {commit[:12]}")  # fmt: skip
    return f"updated to {TEMPLATE} {version}, the template's {commit[:12]}"


def _same_commit(checkout: Path, recorded: str, commit: str) -> bool:
    """`recorded`: copier's `git describe` of the commit it rendered (a tag or a short hash)."""
    if not recorded:
        return False
    proc = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{recorded}^{{commit}}"],
                          cwd=checkout, capture_output=True, text=True)  # fmt: skip
    return proc.returncode == 0 and proc.stdout.strip() == commit


def _set_source(root: Path, url: str) -> None:
    record = root / RECORD
    text = re.sub(r"^_src_path: .*$", f"_src_path: {url}", record.read_text(encoding="utf-8"),
                  flags=re.M)  # fmt: skip
    record.write_text(text, encoding="utf-8")
    git(root, "add", RECORD)
    git(root, *_ident(root), "commit", "-q", "--no-verify", "-m", f"Take {TEMPLATE} from {url}")


def _in_the_way(root: Path, checkout: Path, record: dict[str, str]) -> list[str]:
    """Files the newer scaffold writes that the project has but does not track: copier would
    overwrite them (a user's .env, their data) without a word."""
    render = checkout.parent / "render"
    answers = {k: v for k, v in record.items() if not k.startswith("_")}
    copier(["copy", "--trust", "--defaults", "--quiet", "--skip-tasks", "--vcs-ref", "HEAD",
            *answers_args(answers), f"git+file://{checkout}", str(render)])  # fmt: skip
    incoming = [p.relative_to(render).as_posix() for p in render.rglob("*") if p.is_file()]
    tracked = set(_paths(root, "ls-files"))
    return sorted(p for p in incoming if p not in tracked and os.path.lexists(root / p))


def _untracked(root: Path) -> list[str]:
    return _paths(root, "ls-files", "--others", "--exclude-standard")


def _conflicted(root: Path) -> list[str]:
    """The changed files copier left with inline conflict markers."""
    marker = re.compile(r"^<<<<<<< ", re.M)
    changed = _paths(root, "diff", "--name-only")
    texts = {p: (root / p).read_text(errors="replace") for p in changed if (root / p).is_file()}
    return [p for p, text in texts.items() if marker.search(text)]


def pinned_version(root: Path) -> str:
    """The fasttrain version the project's pyproject pins."""
    found = re.search(rf'"{TEMPLATE}==([^"\]]+)"', (root / "pyproject.toml").read_text())
    return found.group(1) if found else "(unpinned)"


def _listing(paths: list[str], most: int = 5) -> str:
    more = f" and {len(paths) - most} more" if len(paths) > most else ""
    return ", ".join(paths[:most]) + more


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
    try:
        if args.command == "create":
            dest = create(args.dest, args.package, args.project, args.author, args.python,
                          init_git=not args.no_git)  # fmt: skip
            print(f"created {dest}: cd {shlex.quote(str(dest))} && make test")  # pasteable
        elif args.command == "wheel":
            print(f"built {build_wheel(args.src, args.dest)}")
        else:
            print(update(args.root.resolve(), args.source, args.ref))
    except MergeConflict as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except NewProjectError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
