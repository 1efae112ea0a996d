"""README.md is an entry and docs/ the reference: every relative link in them resolves (to a
file or folder, and to a heading when it names one), README.md stays short, and the
reconcile-rule table exists once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.markdown import anchors, prose

REPO = Path(__file__).resolve().parents[3]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_BYTES = 15_000
# The header row of the reconcile-rule table (docs/api.md#reconcile-rules): it lives in one place.
RULES_HEADER = "| situation | what happens (status, Event) |"

# [text](target) or [text](target "title"), images included; target may be <wrapped>.
LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(prose(page))]


def broken_links(page: Path) -> list[str]:
    """'target: why' for each relative link of the page that does not resolve."""
    broken = []
    for target in links(page):
        if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http(s), mailto: not ours to check
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        shown = dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest
        if not dest.exists():
            broken.append(f"{target}: {shown} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(
                f"{target}: no heading #{anchor} in {shown} (has: {', '.join(sorted(anchors(dest)))})"
            )
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_resolve(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(REPO)}: broken links:\n  " + "\n  ".join(broken)


def test_the_checker_catches_a_broken_link_and_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n\n## The `make test` target\n\n## Twice\n\n## Twice\n")
    (tmp_path / "sub").mkdir()
    page = tmp_path / "p.md"
    page.write_text(
        "# Top: a heading, with punctuation!\n\n"
        "[ok](#top-a-heading-with-punctuation) [bad](#nope) [gone](missing.md)\n"
        "[dir](sub) [code](other.md#the-make-test-target) [second](other.md#twice-1)\n"
        "[wrong anchor](other.md#the-target) [web](https://example.com/x#y) [mail](mailto:a@b)\n"
        "```\n[in code](x.md)\n```\n"
    )
    assert links(page)[:3] == ["#top-a-heading-with-punctuation", "#nope", "missing.md"]
    assert "x.md" not in links(page)
    assert anchors(tmp_path / "other.md") == {"other-page", "the-make-test-target", "twice", "twice-1"}
    assert [b.split(":")[0] for b in broken_links(page)] == ["#nope", "missing.md", "other.md#the-target"]


def test_readme_is_an_entry_not_the_reference():
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes (at most {README_MAX_BYTES}); move reference material into docs/"
    )


def test_the_reconcile_rule_table_exists_once():
    holders = [p.relative_to(REPO).as_posix() for p in PAGES if RULES_HEADER in p.read_text(encoding="utf-8")]
    assert holders == ["docs/api.md"], (
        f"the reconcile-rule table ({RULES_HEADER!r}) must be in docs/api.md only; found in {holders}"
    )
