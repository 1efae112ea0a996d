"""A thin contract: every module in contract/ is read by both sides, the operator's code
(operator/holmes/...) and the trainer's (trainer/holmes/...), directly or through another contract
module they read. What only one side reads lives on that side, so neither image carries the other's
code (issue 47). Parsed, not imported, like tests/test_import_directions.py."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CONTRACT = "holmes.contract"
SIDES = {"operator": "operator/holmes", "trainer": "trainer/holmes"}


def contract_modules(root: Path = REPO) -> dict[str, Path]:
    """holmes.contract.<name> -> its file (the package's __init__ as holmes.contract)."""
    folder = root / "contract" / "holmes" / "contract"
    return {
        CONTRACT if f.stem == "__init__" else f"{CONTRACT}.{f.stem}": f for f in sorted(folder.glob("*.py"))
    }


def reexports(init: Path) -> dict[str, str]:
    """Name -> the submodule the package's __init__ takes it from (``from .jobspec import ModelSpec``)."""
    out = {}
    for node in ast.walk(ast.parse(init.read_text(), str(init))):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            out.update({a.asname or a.name: f"{CONTRACT}.{node.module}" for a in node.names})
    return out


def contract_imports(path: Path, package: str, modules: dict[str, Path], names: dict[str, str]) -> set[str]:
    """The contract modules a file imports, anywhere in it (a lazy or TYPE_CHECKING import counts): a
    name taken from the package counts as the submodule it is, or the one the package re-exports it from."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            sources = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            sources = [(base, a.name) for a in node.names]
        else:
            continue
        for source, name in sources:
            if name and f"{source}.{name}" in modules:
                found.add(f"{source}.{name}")
            elif source == CONTRACT and name in names:
                found.add(names[name])
            elif source in modules:
                found.add(source)
    return found


def readers(root: Path = REPO) -> dict[str, set[str]]:
    """Side -> the contract modules its code reads, directly or through other contract modules."""
    modules = contract_modules(root)
    names = reexports(modules[CONTRACT]) if CONTRACT in modules else {}
    graph = {m: contract_imports(p, CONTRACT, modules, names) - {m} for m, p in modules.items()}
    out = {}
    for side, folder in SIDES.items():
        reached: set[str] = set()
        for f in sorted((root / folder).rglob("*.py")):
            package = ".".join(f.relative_to(root).parts[1:-1])
            reached |= contract_imports(f, package, modules, names)
        todo = list(reached)
        while todo:
            for m in graph[todo.pop()] - reached:
                reached.add(m)
                todo.append(m)
        out[side] = reached
    return out


def one_sided(root: Path = REPO) -> list[str]:
    read = readers(root)
    out = []
    for m in sorted(set(contract_modules(root)) - {CONTRACT}):
        sides = [s for s in SIDES if m in read[s]]
        if len(sides) < len(SIDES):
            who = f"only the {sides[0]}" if sides else "neither side"
            out.append(f"{m} is read by {who}")
    return out


def test_every_contract_module_is_read_by_both_sides():
    bad = one_sided()
    assert not bad, (
        "move each to the side that reads it (operator/holmes/plan or .../operator; trainer/holmes/trainer "
        "or .../launch), or to hack/ if only the build reads it:\n" + "\n".join(bad)
    )


def test_the_both_sides_check_can_fail(tmp_path):
    """A module only the planner reads, one only the trainer reads through a shared module, one
    nobody reads, and one both read (through the package's re-export on one side) are told apart."""
    contract = tmp_path / "contract/holmes/contract"
    plan = tmp_path / "operator/holmes/plan"
    trainer = tmp_path / "trainer/holmes/trainer"
    for d in (contract, plan, trainer):
        d.mkdir(parents=True)
    (contract / "__init__.py").write_text("from .spec import Spec\n")
    (contract / "spec.py").write_text("def f():\n    from . import schedules\n")
    (contract / "schedules.py").write_text("")
    (contract / "table.py").write_text("")
    (contract / "crd.py").write_text("from .spec import Spec\n")
    (plan / "cost.py").write_text("from holmes.contract import Spec\nfrom holmes.contract.table import X\n")
    (trainer / "config.py").write_text("from ..contract import spec\n")
    assert readers(tmp_path) == {
        "operator": {"holmes.contract.spec", "holmes.contract.schedules", "holmes.contract.table"},
        "trainer": {"holmes.contract.spec", "holmes.contract.schedules"},
    }
    assert one_sided(tmp_path) == [
        "holmes.contract.crd is read by neither side",
        "holmes.contract.table is read by only the operator",
    ]
