"""Shapes that keep the operator readable (issues 24, 37, 47). Parsed, not imported.

- Its kopf wiring (handlers.py) stays a page or so.
- The pure core (operator/holmes/operator/core/) is read the way JobSet's reconcile is: the state
  machine is ``reconcile.decide`` calling one step after another, each a plain function over one
  pass's state (``state.JobState``) in a module named for the step. A 450-line class cap once
  stood here instead; to stay under it the machine became a four-level inheritance chain, so
  ``self.stall`` resolved across four files. What the cap was for is checked directly:
  - no class in core/ derives from another class of core/ (a step's helpers are found by reading
    its imports, not its base classes);
  - every function of the state machine (state.py and the modules that import it) fits on a
    screen, so a step reads top to bottom;
  - a core module is one concern, never a grab-bag: it stays under CORE_MODULE_MAX_LINES;
  - no core module reaches into another's private names (``_name``): what a step shares with
    the others is public, in state.py or the step's module.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
OPERATOR = REPO / "operator/holmes/operator"
CORE = OPERATOR / "core"
HANDLERS_MAX_LINES = 400
STEP_FUNCTION_MAX_LINES = 60  # the longest step today, tracking.track, is 50
CORE_MODULE_MAX_LINES = 650  # the largest policy module today, capacity.py, is 616


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _core_modules(core: Path) -> list[Path]:
    return sorted(core.glob("*.py"))


def _imports_state(tree: ast.Module) -> bool:
    """The module is a step of the state machine: it imports state.py (relatively)."""
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.level == 1:
            if n.module == "state" or (n.module is None and any(a.name == "state" for a in n.names)):
                return True
    return False


def state_machine(core: Path) -> list[Path]:
    """state.py and every core module that imports it (the steps)."""
    return [p for p in _core_modules(core) if p.name == "state.py" or _imports_state(_tree(p))]


def inherited_classes(core: Path) -> list[str]:
    trees = {p: _tree(p) for p in _core_modules(core)}
    ours = {n.name for t in trees.values() for n in ast.walk(t) if isinstance(n, ast.ClassDef)}
    found = []
    for path, tree in trees.items():
        for n in ast.walk(tree):
            if not isinstance(n, ast.ClassDef):
                continue
            for base in n.bases:
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", None)
                if name in ours:
                    found.append(f"{path.name}: class {n.name}({name})")
    return found


def long_functions(paths: list[Path], limit: int) -> list[str]:
    return [
        f"{p.name}: {n.name} is {n.end_lineno - n.lineno + 1} lines"
        for p in paths
        for n in ast.walk(_tree(p))
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > limit
    ]


def long_modules(paths: list[Path], limit: int) -> list[str]:
    sizes = {p.name: len(p.read_text().splitlines()) for p in paths}
    return [f"{name} is {lines} lines" for name, lines in sizes.items() if lines > limit]


def private_reaches(paths: list[Path]) -> list[str]:
    """Imports of another module's ``_name``, and ``module._name`` on an imported module."""
    found = []
    for p in paths:
        tree = _tree(p)
        modules = set()
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom):
                for a in n.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        found.append(f"{p.name}: from {'.' * n.level}{n.module or ''} import {a.name}")
                    modules.add(a.asname or a.name)
            elif isinstance(n, ast.Import):
                modules.update((a.asname or a.name).split(".")[0] for a in n.names)
        for n in ast.walk(tree):
            if (
                isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id in modules
                and n.attr.startswith("_")
                and not n.attr.startswith("__")
            ):
                found.append(f"{p.name}: {n.value.id}.{n.attr}")
    return found


def test_the_kopf_wiring_stays_short():
    lines = len((OPERATOR / "handlers.py").read_text().splitlines())
    assert lines < HANDLERS_MAX_LINES, (
        f"handlers.py is {lines} lines: move a concern into a module of its own"
    )


def test_the_state_machine_is_functions_not_a_class_chain():
    found = inherited_classes(CORE)
    assert not found, (
        "core/ keeps no inheritance between its own classes: write the rule as a function over "
        "state.JobState in the step's module:\n" + "\n".join(found)
    )


def test_every_step_of_the_state_machine_reads_on_one_screen():
    steps = state_machine(CORE)
    assert {"state.py", "reconcile.py", "launching.py", "tracking.py"} <= {p.name for p in steps}
    found = long_functions(steps, STEP_FUNCTION_MAX_LINES)
    assert not found, (
        "split the step into named sub-steps (each returns the Decision when the pass ends there, "
        "None to go on):\n" + "\n".join(found)
    )


def test_no_core_module_is_a_grab_bag():
    found = long_modules(_core_modules(CORE), CORE_MODULE_MAX_LINES)
    assert not found, "split by concern (a policy module of its own, a step of its own):\n" + "\n".join(found)


def test_no_core_module_reaches_into_another_s_private_names():
    found = private_reaches(_core_modules(CORE))
    assert not found, (
        "make what two modules share public (a primitive in state.py, a public function of the "
        "step's module):\n" + "\n".join(found)
    )


def test_the_checks_can_fail(tmp_path):
    (tmp_path / "state.py").write_text("class JobState:\n    pass\n\ndef _helper():\n    pass\n")
    (tmp_path / "launching.py").write_text(
        "from .state import JobState, _helper\n"
        "from . import state\n\n"
        "class Launching(JobState):\n    pass\n\n"
        "def launch(st):\n" + "    x = 1\n" * STEP_FUNCTION_MAX_LINES + "    return state._helper()\n"
    )
    (tmp_path / "capacity.py").write_text("x = 1\n" * (CORE_MODULE_MAX_LINES + 1))
    assert [p.name for p in state_machine(tmp_path)] == ["launching.py", "state.py"]
    assert inherited_classes(tmp_path) == ["launching.py: class Launching(JobState)"]
    assert long_functions(state_machine(tmp_path), STEP_FUNCTION_MAX_LINES) == [
        f"launching.py: launch is {STEP_FUNCTION_MAX_LINES + 2} lines"
    ]
    assert long_modules(_core_modules(tmp_path), CORE_MODULE_MAX_LINES) == [
        f"capacity.py is {CORE_MODULE_MAX_LINES + 1} lines"
    ]
    assert private_reaches(_core_modules(tmp_path)) == [
        "launching.py: from .state import _helper",
        "launching.py: state._helper",
    ]
