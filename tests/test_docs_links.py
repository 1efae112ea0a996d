"""README.md is an entry and docs/ the reference: every relative link in them resolves (to a
file, and to a heading when it names one), README.md stays short, and the reconcile-rule
table exists once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
RULES_HEADER = "| situation | what happens (status, Event) |"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than '-' dropped, spaces -> '-'."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(FENCE.sub("", page.read_text()))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(page):
    broken = []
    for target in links(page):
        if re.match(r"^[a-z]+:", target):  # http(s), mailto: not ours to check
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(
                f"{target}: {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest} missing"
            )
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: broken links:\n" + "\n".join(broken)


def test_the_checker_catches_a_broken_link_and_anchor(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Top\n\n[ok](#top) [bad](#nope) [gone](missing.md)\n```\n[in code](x.md)\n```\n")
    assert links(page) == ["#top", "#nope", "missing.md"]
    assert anchors(page) == {"top"}


def test_readme_is_an_entry_not_the_reference():
    size = len((REPO / "README.md").read_bytes())
    assert size <= 15_000, f"README.md is {size} bytes; move reference material into docs/"


def test_the_reconcile_rule_table_exists_once():
    holders = [p.name for p in PAGES if RULES_HEADER in p.read_text()]
    assert holders == ["api.md"], holders
