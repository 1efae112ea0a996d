"""docs/concurrency.md is the one place the operator's locks are written down (issue 46): every
lock the operator side creates is in its table, and the placement locks are taken in the order
the page gives. Parsed, not imported."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "concurrency.md"
LOCKS = {"Lock", "RLock", "Condition", "Semaphore", "BoundedSemaphore"}


def locks_created(root: Path) -> set[str]:
    """``module.Class.attribute`` of every ``self.x = threading.<lock>()`` under ``root``."""
    out = set()
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                    continue
                fn = node.value.func
                if not (isinstance(fn, ast.Attribute) and fn.attr in LOCKS):
                    continue
                for target in node.targets:
                    if isinstance(target, ast.Attribute):
                        out.add(f"{path.stem}.{cls.name}.{target.attr}")
    return out


def test_every_lock_of_the_operator_side_is_in_the_page():
    page = DOC.read_text()
    found = locks_created(REPO / "operator" / "holmes")
    assert {"commit.PlacementLock._turn", "commit.PlacementLock._state"} <= found  # the check sees them
    missing = sorted(lock for lock in found if f"`{lock}`" not in page)
    assert not missing, f"add each lock, what it guards and what runs under it to {DOC.name}: {missing}"


def test_the_claim_turn_is_taken_before_the_claim_state():
    source = (REPO / "operator/holmes/operator/commit.py").read_text()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.With):
            names = [ast.unparse(item.context_expr) for item in node.items]
            if names == ["self._state", "self._turn"]:
                raise AssertionError("commit.py takes _state before _turn: the page's order is _turn first")
            for inner in (n for n in ast.walk(node) if isinstance(n, ast.With) and n is not node):
                if "self._state" in names and any(
                    ast.unparse(i.context_expr) == "self._turn" for i in inner.items
                ):
                    raise AssertionError("commit.py takes _turn while holding _state")
