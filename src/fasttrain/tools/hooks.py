"""The pre-commit checks no installed package has, run on the files of each commit by
.pre-commit-config.yaml (a new project's and this repository's), offline:

    python -m fasttrain.tools.hooks secrets FILE...     no tracker credential, no .env
    python -m fasttrain.tools.hooks notebooks FILE...   no notebook committed with outputs

One line per finding, naming the file (and line), and exit code 1. A committed key is in every
clone for good, so it is stopped before the commit: a W&B API key (40 hex digits on a line
about W&B or an api_key), a tracker credential given a value (WANDB_API_KEY, MLflow's tracking
password or token), a URI carrying user:password@, and any .env file, which holds the real
values (.env.example, names only, is meant to be committed).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# .env, .env.local, .env.prod...; the templates of one are committed on purpose
ENV_TEMPLATES = {".env.example", ".env.sample", ".env.template"}
_NAMES = (
    r"(?i:wandb_api_key|mlflow_tracking_password|mlflow_tracking_token|tracking_password"
    r"|tracking_token|api_key)"
)
_WANDB_KEY = r"(?i)(wandb|api_key).*(?<![0-9a-f])[0-9a-f]{40}(?![0-9a-f])"
# a quoted literal, in code too; a reference ($X, ${..}, <..>) is no secret
_QUOTED = rf"""{_NAMES}["'\]]*\s*[:=]\s*(["'])[^\s"'$<{{]{{4,}}\1"""
_URI = r"\b[a-z][a-z0-9+.-]*://[^\s/:@\"'<>{}$]+:[^\s/@\"'<>{}$]+@"
RULES = {
    "a W&B API key": re.compile(_WANDB_KEY),
    "a tracker credential": re.compile(_QUOTED),
    "a URI with user:password@": re.compile(_URI),
}
# A bare value, the whole rest of a line of .env, YAML or shell (never code: `api_key = key`).
BARE = re.compile(
    rf"^\s*(?:export\s+|-\s+)?{_NAMES}\s*[:=]\s*(?!(?i:null|none|~)\s*(?:#|$))"
    r"[^\s\"'$<{#]+\s*(?:#.*)?$"
)


def secrets(paths: list[str]) -> list[str]:
    """The findings in `paths`: `path:line: what`, or `path: ...` for a .env file."""
    found = []
    for path in paths:
        name = Path(path).name
        if name == ".env" or (name.startswith(".env.") and name not in ENV_TEMPLATES):
            found.append(f"{path}: a .env file holds the real secrets: keep it out of git "
                         "(git rm --cached it; .gitignore lists it)")  # fmt: skip
            continue
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary (a wheel, an image): no key written by hand
        for number, line in enumerate(text.splitlines(), 1):
            what = [what for what, rule in RULES.items() if rule.search(line)]
            if not path.endswith(".py") and BARE.search(line):
                what.append("a tracker credential")
            if what:
                found.append(f"{path}:{number}: {what[0]}: put it in the environment or .env "
                             "(see .env.example), never in a committed file")  # fmt: skip
    return found


def notebooks(paths: list[str]) -> list[str]:
    """Notebooks committed with outputs (diffs stop being reviewable)."""
    found = []
    for path in paths:
        cells = json.loads(Path(path).read_text(encoding="utf-8")).get("cells", [])
        if any(c.get("outputs") or c.get("execution_count") is not None for c in cells):
            found.append(f"{path}: has outputs: jupyter nbconvert --clear-output --inplace {path}")
    return found


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    checks = {"secrets": secrets, "notebooks": notebooks}
    if not args or args[0] not in checks:
        print(f"usage: python -m fasttrain.tools.hooks {'|'.join(checks)} FILE...", file=sys.stderr)
        return 2
    found = checks[args[0]](args[1:])
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
