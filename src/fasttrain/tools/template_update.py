"""`make update-template` in a project made by `make new-project`: take a newer fasttrain into it
(fasttrain.tools.new_project says what a project is). An update is a newer wheel, the pin moved,
and `copier update` of the scaffold: a three-way merge that keeps the project's own edits and
files. Nothing changes where it cannot run, the project is restored where it fails midway, and
conflicts are left to resolve.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from fasttrain.tools.template_git import (
    RECORD,
    ROOT,
    SCAFFOLD,
    TEMPLATE,
    NewProjectError,
    answers_args,
    copier,
    git,
    git_identity,
    git_paths,
    read_record,
    template_url,
)


class MergeConflict(NewProjectError):
    """copier left conflicts: the project is mid-update, its changes uncommitted."""


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
    git(root, *git_identity(root), "commit", "-q", "--no-verify", "-m",
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
    message = f"Take {TEMPLATE} from {url}"
    git(root, *git_identity(root), "commit", "-q", "--no-verify", "-m", message)


def _in_the_way(root: Path, checkout: Path, record: dict[str, str]) -> list[str]:
    """Files the newer scaffold writes that the project has but does not track: copier would
    overwrite them (a user's .env, their data) without a word."""
    render = checkout.parent / "render"
    answers = {k: v for k, v in record.items() if not k.startswith("_")}
    copier(["copy", "--trust", "--defaults", "--quiet", "--skip-tasks", "--vcs-ref", "HEAD",
            *answers_args(answers), f"git+file://{checkout}", str(render)])  # fmt: skip
    incoming = [p.relative_to(render).as_posix() for p in render.rglob("*") if p.is_file()]
    tracked = set(git_paths(root, "ls-files"))
    return sorted(p for p in incoming if p not in tracked and os.path.lexists(root / p))


def _untracked(root: Path) -> list[str]:
    return git_paths(root, "ls-files", "--others", "--exclude-standard")


def _conflicted(root: Path) -> list[str]:
    """The changed files copier left with inline conflict markers."""
    marker = re.compile(r"^<<<<<<< ", re.M)
    changed = git_paths(root, "diff", "--name-only")
    texts = {p: (root / p).read_text(errors="replace") for p in changed if (root / p).is_file()}
    return [p for p, text in texts.items() if marker.search(text)]


def pinned_version(root: Path) -> str:
    """The fasttrain version the project's pyproject pins."""
    found = re.search(rf'"{TEMPLATE}==([^"\]]+)"', (root / "pyproject.toml").read_text())
    return found.group(1) if found else "(unpinned)"


def _listing(paths: list[str], most: int = 5) -> str:
    more = f" and {len(paths) - most} more" if len(paths) > most else ""
    return ", ".join(paths[:most]) + more
