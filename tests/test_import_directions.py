"""The dependency table of README.md, enforced: every import in each product package (module
level or inside a function) stays within what its row allows. Parsed, not imported, so a
lazy import inside a function counts too."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names)
# standard-library modules that talk to the world: a pure module imports none of them
IO_STDLIB = {
    "socket",
    "ssl",
    "http",
    "urllib",
    "subprocess",
    "asyncio",
    "threading",
    "select",
    "selectors",
    "concurrent",
    "multiprocessing",
    "shutil",
    "tempfile",
    "time",
    "logging",
}
PURE = {"operator/holmes/operator/core"}

# package folder -> (allowed top-level third-party modules, allowed holmes subpackages)
RULES = {
    "contract/holmes/contract": ({"yaml"}, {"contract"}),
    "operator/holmes/plan": ({"yaml"}, {"contract", "plan"}),
    "operator/holmes/labeller": ({"kubernetes"}, {"contract", "plan", "labeller"}),
    "operator/holmes/operator": (
        {"kopf", "kubernetes", "prometheus_client", "yaml"},
        {"contract", "plan", "operator"},
    ),
    # the operator's pure core: decisions from data, no client, no sockets, no clock of its own
    "operator/holmes/operator/core": ({"yaml"}, {"contract", "plan", "operator.core"}),
    "trainer/holmes/trainer": (
        {"torch", "numpy", "prometheus_client", "tokenizers", "safetensors"},
        {"contract", "trainer", "launch"},  # launch: the pod's network resolver, standard library only
    ),
    # copied into pods of the user's own image: nothing but the standard library and its torch
    "trainer/holmes/launch": ({"torch"}, {"launch"}),
}
CLI = REPO / "operator/holmes/cli.py"  # `holmes plan`: the planner, plus the client for --kubeconfig
CLI_RULE = ({"kubernetes", "yaml"}, {"contract", "plan", "operator"})  # operator: --pods (pure preview)


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(REPO).parts[1:-1])  # e.g. holmes.plan


def imports(path: Path, package: str) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every import in the file; relative ones resolved."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                out.append((node.lineno, ".".join(base + ([node.module] if node.module else []))))
            else:
                out.append((node.lineno, node.module))
    return out


def violations(
    path: Path, rule: tuple[set[str], set[str]], package: str | None = None, pure: bool = False
) -> list[str]:
    third_party, holmes = rule
    bad = []
    for line, name in imports(path, package or package_of(path)):
        top = name.split(".")[0]
        if pure and top in IO_STDLIB:
            bad.append(f"{path.name}:{line}: imports {name} (I/O in a pure module)")
            continue
        if top == "holmes":
            parts = name.split(".")
            # "operator.core" allows holmes.operator.core only; "operator" any holmes.operator
            if not any(parts[1 : 1 + len(a.split("."))] == a.split(".") for a in holmes):
                bad.append(f"{path.name}:{line}: imports {name}")
        elif top not in STDLIB and top != "__future__" and top not in third_party:
            bad.append(f"{path.name}:{line}: imports {name}")
    return bad


@pytest.mark.parametrize("folder", sorted(RULES))
def test_package_imports_only_what_its_row_allows(folder):
    nested = [f for f in RULES if f != folder and f.startswith(folder + "/")]
    files = [
        f
        for f in sorted((REPO / folder).rglob("*.py"))
        if not any(f.is_relative_to(REPO / n) for n in nested)
    ]
    assert files, f"{folder} holds no Python files"
    bad = [v for f in files for v in violations(f, RULES[folder], pure=folder in PURE)]
    assert not bad, "imports against the dependency table (README.md):\n" + "\n".join(bad)


def test_cli_imports_only_the_planner_and_the_contract():
    assert not violations(CLI, CLI_RULE)


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """A checker that misses a function-level import or a relative one could never fail."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f():\n    import torch\n    from ..operator import kube\n    from . import costmodel\n"
    )
    found = violations(probe, RULES["operator/holmes/plan"], package="holmes.plan")
    assert found == ["probe.py:2: imports torch", "probe.py:3: imports holmes.operator"]


def test_the_pure_core_refuses_the_client_and_io(tmp_path):
    """The purity rule can fail: a core module importing the client, or urllib, is caught."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import urllib.request\nfrom kubernetes import client\nfrom .. import kube\nfrom . import render\n"
    )
    found = violations(
        probe, RULES["operator/holmes/operator/core"], package="holmes.operator.core", pure=True
    )
    assert found == [
        "probe.py:1: imports urllib.request (I/O in a pure module)",
        "probe.py:2: imports kubernetes",
        "probe.py:3: imports holmes.operator",
    ]
