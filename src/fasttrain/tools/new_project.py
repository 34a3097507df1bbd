"""Copy this template into a new project under a new package name, and later bring a newer
template's changes into that project: the one place that knows how.

    make new-project NAME=acme_vision DEST=../acme_vision
    python src/fasttrain/tools/new_project.py create ../acme_vision --package acme_vision
    copier copy --trust <this repo> ../acme_vision   (copier.yml runs `rename` after copying)

    make update-template [FROM=path-or-git-url] [REF=branch-or-tag]     (in the new project)
    python src/acme_vision/tools/new_project.py update [FROM] [--ref REF]

Updates are git merges. A new project keeps, on its branch `template`, the template as it was
rendered for it (its first commit). `update` renders the newer template the same way (with
the newer template's own code, under the project's names), commits that on `template`, and
merges `template` into the current branch: the template's changes come in where the project
left those lines alone, the project's own files and changes stay, and a line both changed is a
git conflict to resolve. `.template.json` records where the template came from and at which
commit.

Both copy the template as committed (`git archive`), never its working tree: uncommitted edits,
untracked and ignored files (.env, data/) of the checkout are no part of it. Were they, the
branch `template` would hold them and the next update, rendered without them, would delete or
revert them in the project.

Standard library only, so it runs before any environment exists.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import keyword
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

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
RECORD = ".template.json"  # in a new project: where its template came from (`update` reads it)
BRANCH = "template"  # in a new project's git: the template as rendered for it, one commit each
# README text that only holds in the template (how to copy it with copier, whose copier.yml is
# not copied): between these markers, dropped from a copy's README.
TEMPLATE_ONLY = re.compile(r"\n*<!-- template-only -->.*?<!-- /template-only -->\n*", re.S)
# Extract archives with the "data" filter where this Python has it (3.10.12+, 3.11.4+).
SAFE_TAR: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


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


def excluded(name: str) -> bool:
    return name in EXCLUDE or name.endswith((".egg-info", ".pyc"))


def copy_tree(src: Path, dest: Path) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if excluded(n)}

    shutil.copytree(src, dest, ignore=ignore, dirs_exist_ok=True)


def copy_commit(src: Path, commit: str, dest: Path) -> None:
    """The files git tracks in `src` at `commit`, less EXCLUDE, into `dest`."""
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=src,
                             capture_output=True)  # fmt: skip
    if archive.returncode != 0:
        said = archive.stderr.decode(errors="replace").strip().splitlines()
        raise NewProjectError(f"git archive failed: {said[-1] if said else archive.returncode}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        kept = [m for m in tar if not any(map(excluded, PurePosixPath(m.name).parts))]
        tar.extractall(dest, members=kept, **SAFE_TAR)


def note_uncommitted(src: Path, commit: str) -> None:
    """Say so where the checkout differs from what was copied (ignored files aside)."""
    changes = len(git(src, "status", "--porcelain").splitlines())
    if changes:
        print(f"note: copying the template as committed at {commit[:12]}; {changes} uncommitted "
              f"change(s) in {src.resolve()} are not copied", file=sys.stderr)  # fmt: skip


def _replace(text: str, package: str, project: str) -> str:
    text = re.sub(rf"^# {TEMPLATE_PROJECT}\b", f"# {project}", text, flags=re.M)  # README title
    text = re.sub(rf'^name = "{TEMPLATE_PROJECT}"', f'name = "{project}"', text, flags=re.M)
    text = re.sub(rf"\b{TEMPLATE_PROJECT}-(\w)", rf"{project}-\1", text)  # console scripts
    text = text.replace(TEMPLATE.upper(), package.upper())  # env vars (FASTTRAIN_ROOT)
    return text.replace(TEMPLATE, package)


def rename(root: Path, package: str, project: str, author: str = "", python: str = "",
           check: bool = True) -> None:  # fmt: skip
    """Rename the package in `root` (a fresh copy): folder, imports, `_target_`s, pyproject,
    README title, Makefile, env var names; then set author and Python version if given."""
    if check:
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


def git_init(root: Path, message: str) -> None:
    """`git init`, a first commit, and the branch `template` at it (what `update` merges from),
    under the user's git identity (a neutral one if unset)."""
    if shutil.which("git") is None:
        print("git not found: the project is not a repository yet", file=sys.stderr)
        return
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, *_ident(root), "commit", "-q", "-m", message)
    git(root, "branch", BRANCH)


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


def write_record(root: Path, source: str, commit: str, package: str, project: str,
                 author: str, python: str) -> None:  # fmt: skip
    record = {"source": source, "commit": commit, "package": package, "project": project,
              "author": author, "python": python}  # fmt: skip
    (root / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def create(dest: Path, package: str, project: str = "", author: str = "", python: str = "",
           src: Path = ROOT, init_git: bool = True, source: str = "", commit: str = "",
           for_update: bool = False) -> Path:  # fmt: skip
    """Copy `src` (as committed, where it is a git checkout) to `dest` and rename it; refuse bad
    names or a non-empty `dest` first.
    `source`/`commit`: where the template came from, if not `src` (an update's checkout);
    `for_update`: a rendering for `update`, whose package is importable by then."""
    if not for_update:
        check_package(package)
    dest = dest.resolve()
    check_dest(dest)
    copied = template_commit(src)
    if copied:
        copy_commit(src, copied, dest)
        note_uncommitted(src, copied)
    else:  # no repository to say what the template is: the folder as it stands
        copy_tree(src, dest)
    project = project or package.replace("_", "-")
    rename(dest, package, project, author, python, check=not for_update)
    write_record(dest, source or str(src.resolve()), copied or commit, package, project,
                 author, python)  # fmt: skip
    if init_git:
        git_init(dest, f"New project {package}, from the {TEMPLATE} template")
    return dest


class MergeConflict(NewProjectError):
    """The merge stopped on conflicts: the project is mid-merge, as git leaves it."""


def update(root: Path, source: str = "", ref: str = "") -> str:
    """Merge a newer template into the project in `root` (see the module doc); what happened,
    in one line. NewProjectError before anything changes if it cannot; a merge that conflicts
    is left to resolve, as `git merge` leaves it."""
    record_file = root / RECORD
    if not record_file.is_file():
        raise NewProjectError(f"no {RECORD} in {root}: not a project made from the template")
    record = json.loads(record_file.read_text(encoding="utf-8"))
    if git(root, "status", "--porcelain", "--untracked-files=no").strip():
        raise NewProjectError("the project has uncommitted changes: commit or stash them first")
    branch = ["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{BRANCH}"]
    if subprocess.run(branch, cwd=root, capture_output=True).returncode != 0:
        first = "<the project's first commit>"
        raise NewProjectError(f"no branch '{BRANCH}' (the template as first rendered here): "
                              f"git branch {BRANCH} {first}, then again")  # fmt: skip
    source = source or record.get("source", "")
    if not source:
        raise NewProjectError(f"{RECORD} names no template source: give one, "
                              "make update-template FROM=path-or-git-url")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        checkout = Path(tmp) / "template"
        git(root, "clone", "-q", *(["--branch", ref] if ref else []), source, str(checkout))
        commit = template_commit(checkout)
        if commit and commit == record.get("commit"):
            return f"already at the template's {commit[:12]}: nothing to merge"
        _render(checkout, Path(tmp) / "render", record, source, commit)
        old = git(root, "rev-parse", BRANCH).strip()
        strays = _strays(root, checkout, record)
        _commit_rendering(root, Path(tmp) / "render", Path(tmp) / "worktree", commit, strays)
    in_the_way = _in_the_way(root, old)
    if in_the_way:  # nothing changed yet: the branch back where it was
        git(root, "update-ref", f"refs/heads/{BRANCH}", old)
        raise NewProjectError(f"the template's {commit[:12]} would overwrite {len(in_the_way)} "
                              f"file(s) the project does not track: {_listing(in_the_way)}; "
                              "move them away (or commit them), then again")  # fmt: skip
    head = git(root, "rev-parse", "HEAD").strip()
    merged = subprocess.run(["git", *_ident(root), "merge", "--no-edit", BRANCH], cwd=root,
                            capture_output=True, text=True)  # fmt: skip
    if merged.returncode != 0:
        conflicts = git(root, "diff", "--name-only", "--diff-filter=U").split()
        if not conflicts:  # refused before it began (an untracked file in the way, ...)
            said = (merged.stderr.strip() or merged.stdout.strip()).splitlines()
            raise NewProjectError(f"git merge {BRANCH} refused: {said[0] if said else ''}")
        raise MergeConflict(f"the template's {commit[:12]} conflicts with the project's changes "
                            f"in {', '.join(conflicts)}: resolve them and git commit "
                            "(or git merge --abort)")  # fmt: skip
    removed = _paths(root, "diff", "--name-only", "--no-renames", "--diff-filter=D", head, "HEAD")
    line = f"merged the template's {commit[:12]} into the project"
    if removed:  # the template dropped them; the project had left them alone
        line += f"; it removed {len(removed)} file(s) the template no longer ships: "
        line += _listing(removed)
    return line


def _paths(root: Path, *args: str) -> list[str]:
    """The paths a git command lists (with -z, right after the command: any name, unquoted)."""
    return [p for p in git(root, args[0], "-z", *args[1:]).split("\0") if p]


def _listing(paths: list[str], most: int = 5) -> str:
    more = f" and {len(paths) - most} more" if len(paths) > most else ""
    return ", ".join(paths[:most]) + more


def _in_the_way(root: Path, old: str) -> list[str]:
    """Files the template's side of the merge writes that the project has but does not track:
    git merge refuses untracked ones without naming them, and overwrites ignored ones (a
    user's .env, data) silently."""
    incoming = _paths(root, "diff", "--name-only", "--no-renames", "--diff-filter=d", old, BRANCH)
    tracked = set(_paths(root, "ls-files"))
    return [p for p in incoming if p not in tracked and os.path.lexists(root / p)]


def _strays(root: Path, checkout: Path, record: dict) -> list[str]:
    """Files on the branch `template` that the template did not track at the commit it was
    rendered from: an older `create` copied its checkout's working tree (.env, data/) into the
    first commit. Rendered without them, the update would delete them from the project."""
    commit = record.get("commit", "")
    known = ["git", "cat-file", "-e", f"{commit}^{{commit}}"]
    if not commit or subprocess.run(known, cwd=checkout, capture_output=True).returncode != 0:
        return []  # a commit this template does not have: nothing to tell them by
    shipped = set(_paths(checkout, "ls-tree", "-r", "--name-only", commit))
    script = re.compile(r"src/([^/]+)/tools/new_project\.py")
    own = [m.group(1) for m in map(script.fullmatch, shipped) if m]
    if len(own) != 1:
        return []
    # the project's src/<package>/ was the template's src/<its package>/ (nothing else moves)
    moved = re.compile(rf"^src/{re.escape(record['package'])}/")
    rendered = _paths(root, "ls-tree", "-r", "--name-only", BRANCH)
    return [p for p in rendered
            if p != RECORD and moved.sub(f"src/{own[0]}/", p) not in shipped]  # fmt: skip


def _render(checkout: Path, render: Path, record: dict, source: str, commit: str) -> None:
    """The newer template, copied and renamed as `create` did for this project, by the newer
    template's own script (its renaming may have changed too)."""
    scripts = list(checkout.glob("src/*/tools/new_project.py"))
    if len(scripts) != 1:
        raise NewProjectError(f"{source} is not the template (no src/<package>/tools/"
                              "new_project.py in it)")  # fmt: skip
    (script,) = scripts
    names = ["--package", record["package"], "--project", record["project"],
             "--author", record["author"], "--python", record["python"]]  # fmt: skip
    args = [sys.executable, str(script), "create", str(render), *names, "--no-git",
            "--for-update", "--source", source, "--commit", commit]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise NewProjectError(f"rendering the template failed: {proc.stderr.strip()[-500:]}")


def _commit_rendering(root: Path, render: Path, worktree: Path, commit: str,
                      strays: list[str]) -> None:  # fmt: skip
    """Make `render` the next commit of the branch `template` (in a worktree of its own, which
    is all that `git rm` clears), keeping `strays` the rendering does not have."""
    git(root, "worktree", "add", "-q", str(worktree), BRANCH)
    try:
        git(worktree, "rm", "-r", "-q", "--ignore-unmatch", ".")
        copy_tree(render, worktree)
        kept = [p for p in strays if not (render / p).exists()]
        if kept:
            git(worktree, "checkout", "HEAD", "--", *kept)
            print(
                f"note: kept {len(kept)} file(s) an older new-project copied from the "
                f"template's uncommitted working tree: {_listing(kept)}",
                file=sys.stderr,
            )
        git(worktree, "add", "-A")
        if git(worktree, "status", "--porcelain").strip():
            git(worktree, *_ident(root), "commit", "-q", "-m", f"Template at {commit[:12]}")
    finally:
        git(root, "worktree", "remove", "--force", str(worktree))


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
        cmd.add_argument("--source", default="", help="where the template came from (record)")
        cmd.add_argument("--commit", default="", help="the template's commit (record)")
        if name == "create":
            cmd.add_argument("--for-update", action="store_true", help=argparse.SUPPRESS)
    cmd = sub.add_parser("update", help="merge a newer template into this project")
    cmd.add_argument("source", nargs="?", default="", help="template path or git URL "
                     f"(default: the one in {RECORD})")  # fmt: skip
    cmd.add_argument("--ref", default="", help="the template's branch or tag (default: its HEAD)")
    cmd.add_argument("--root", type=Path, default=Path("."), help="the project (default: here)")
    args = parser.parse_args(argv)
    try:
        if args.command == "create":
            dest = create(args.dest, args.package, args.project, args.author, args.python,
                          init_git=not args.no_git, source=args.source, commit=args.commit,
                          for_update=args.for_update)  # fmt: skip
            print(f"created {dest}: cd {dest} && make test")
        elif args.command == "rename":
            project = args.project or args.package.replace("_", "-")
            rename(args.root, args.package, project, args.author, args.python)
            write_record(args.root, args.source, args.commit, args.package, project,
                         args.author, args.python)  # fmt: skip
            if not args.no_git:
                git_init(args.root, f"New project {args.package}, from the {TEMPLATE} template")
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
