"""Sizes that keep the operator readable (issues 24, 37): its kopf wiring stays a page or so, and
no class anywhere on the operator side (operator/: the operator, the planner, the labeller, the
CLI) grows into a grab-bag again. Parsed, not imported."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OPERATOR = REPO / "operator/holmes/operator"
OPERATOR_SIDE = REPO / "operator/holmes"
HANDLERS_MAX_LINES = 400
CLASS_MAX_LINES = 450  # the state machine was one 596-line class: split by concern (issue 37)


def long_classes(path: Path, limit: int) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    return [
        f"{path.name}: class {n.name} is {n.end_lineno - n.lineno + 1} lines"
        for n in ast.walk(tree)
        if isinstance(n, ast.ClassDef) and n.end_lineno - n.lineno + 1 > limit
    ]


def test_the_kopf_wiring_stays_short():
    lines = len((OPERATOR / "handlers.py").read_text().splitlines())
    assert lines < HANDLERS_MAX_LINES, (
        f"handlers.py is {lines} lines: move a concern into a module of its own"
    )


def test_no_operator_class_is_a_grab_bag():
    found = [c for f in sorted(OPERATOR_SIDE.rglob("*.py")) for c in long_classes(f, CLASS_MAX_LINES)]
    assert not found, (
        "split by concern (a policy module in core/, a primitive in core/state.py, a step of the "
        "state machine: reconcile.py, launching.py, tracking.py):\n" + "\n".join(found)
    )


def test_the_size_check_can_fail(tmp_path):
    big = tmp_path / "big.py"
    big.write_text("class Big:\n" + "    x = 1\n" * CLASS_MAX_LINES)
    assert long_classes(big, CLASS_MAX_LINES) == [f"big.py: class Big is {CLASS_MAX_LINES + 1} lines"]
