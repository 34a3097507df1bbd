"""README.md is the landing page and docs/ holds one page per topic: the README stays short, every
page is linked from it and starts with its title and a one-line summary, every relative link
leads to a file, and the commands other tests run as written are on the page they cite."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import DOCS, REPO, doc

README = REPO / "README.md"
PAGES = sorted(DOCS.glob("*.md"))
# [text](target): a target with no scheme (http:, mailto:) and not only an anchor (#...)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not markdown
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z0-9+.-]*:|#", t)]


def test_the_readme_is_a_landing_page() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; move a topic to docs/"


@pytest.mark.parametrize("page", [README, *PAGES], ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file(page: Path) -> None:
    links = relative_links(page)
    broken = [t for t in links if not (page.parent / t.split("#")[0]).exists()]
    assert not broken, f"{page.relative_to(REPO)} links to missing files: {broken}"


def test_every_page_is_linked_from_the_readme() -> None:
    assert PAGES, "docs/ has no pages"
    linked = {(REPO / t.split("#")[0]).resolve() for t in relative_links(README)}
    unlinked = [p.name for p in PAGES if p.resolve() not in linked]
    assert not unlinked, f"README.md does not link to docs/{unlinked}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_page_starts_with_its_title_and_a_one_line_summary(page: Path) -> None:
    title, blank, summary, after = page.read_text().split("\n", 4)[:4]
    assert re.match(r"# \S", title), f"{page.name}: the first line is not a `# Title`"
    assert blank == "" and after == "", f"{page.name}: expected `# Title`, a blank line, one line"
    assert summary.strip() and not summary.startswith(("#", "```", "|", "-")), page.name


# Commands that tests run as a user types them, and the page each is on (the test that runs it).
COMMANDS = [
    ("README", "python train.py model=regressor data=diabetes"),  # test_regressor.py
    ("sweeps", "python train.py -m seed=1,2"),  # test_reliability_run_sweeps.py
    ("sweeps", "python train.py -m model.optimizer.lr=1e-3,3e-3 seed=1,2"),
    ("sweeps", "python train.py -m hparams_search=optuna hydra.sweeper.n_trials=30"),
    ("sweeps", "python train.py -m data.batch_size=0,64"),
    # test_tensorboard.py (its server), test_train_cli.py (the printed command)
    ("README", "python -m fasttrain.tools.board --logdir logs --host 127.0.0.1"),
    ("tensorboard-and-notebooks", "python -m fasttrain.tools.board --logdir logs --host 127.0.0.1"),
]


@pytest.mark.parametrize(("page", "command"), COMMANDS)
def test_the_commands_tests_run_are_on_their_pages(page: str, command: str) -> None:
    text = README.read_text() if page == "README" else doc(page)
    assert command in text, f"{command!r} is no longer on {page}: update the test that runs it"
