"""The dependency table of README.md, enforced: every import in each product package (module
level or inside a function) stays within what its row allows; the imports between the product's
modules read one way (no circle, ``TYPE_CHECKING`` imports included); no module imports another
one's private (``_``) name. Parsed, not imported, so a lazy import inside a function counts too."""

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
PURE = {"operator/holmes/operator/core", "operator/holmes/view"}

# package folder -> (allowed top-level third-party modules, allowed holmes subpackages)
RULES = {
    "contract/holmes/contract": ({"yaml"}, {"contract"}),
    "operator/holmes/plan": ({"yaml"}, {"contract", "plan"}),
    "operator/holmes/labeller": ({"kubernetes"}, {"contract", "plan", "labeller"}),
    "operator/holmes/operator": (
        {"kopf", "kubernetes", "urllib3", "prometheus_client", "yaml"},
        {"contract", "plan", "operator"},
    ),
    # pictures and text of layouts and jobs, for people: pure, from the contract's data
    "operator/holmes/view": (set(), {"contract", "view"}),
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
CLI_RULE = (
    {"kubernetes", "yaml"},
    {"contract", "plan", "operator", "view"},
)  # operator: --pods (pure preview)


PRODUCT = ("contract", "operator", "trainer")  # the folders holding the holmes namespace package


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


PLUGIN = REPO / "operator/holmes/kubectl_holmes.py"  # `kubectl holmes`: the CLI's plan, the client, views
PLUGIN_RULE = ({"kubernetes"}, {"cli", "contract", "operator.core", "view"})


def test_kubectl_plugin_imports_only_the_cli_the_client_and_the_views():
    assert not violations(PLUGIN, PLUGIN_RULE)


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


# ---- one direction: no circles, no private names ----------------------------------------------


def module_of(path: Path, root: Path = REPO) -> str:
    """holmes.plan.gpus for operator/holmes/plan/gpus.py; a package's __init__ is the package."""
    parts = list(path.relative_to(root).parts[1:])
    parts[-1] = parts[-1].removesuffix(".py")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def product_modules(root: Path = REPO) -> dict[str, Path]:
    return {module_of(f, root): f for top in PRODUCT for f in sorted((root / top / "holmes").rglob("*.py"))}


def imported_names(path: Path, module: str) -> list[tuple[int, str, str]]:
    """(line, module imported from, name) of every ``from M import name`` (relative resolved)
    and (line, M, "") of every ``import M``."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, "") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            out += [(node.lineno, base, a.name) for a in node.names]
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the product modules it imports (``from pkg import mod`` counts as importing mod)."""
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for m, path in modules.items():
        for _, source, name in imported_names(path, m):
            target = f"{source}.{name}" if f"{source}.{name}" in modules else source
            while target not in modules and "." in target:
                target = target.rpartition(".")[0]
            if target in modules and target != m:
                graph[m].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def private_imports(modules: dict[str, Path], root: Path = REPO) -> list[str]:
    """``from other_module import _name``: a module reaching into another's private name."""
    bad = []
    for m, path in modules.items():
        for line, source, name in imported_names(path, m):
            private = name.startswith("_") and not name.startswith("__")
            if private and source.split(".")[0] == "holmes" and source != m:
                bad.append(f"{path.relative_to(root)}:{line}: imports {source}.{name}")
    return bad


def test_the_product_imports_read_one_way():
    found = circles(import_graph(product_modules()))
    assert not found, "import circles (move what both need into a module both import):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_no_module_imports_a_private_name_of_another():
    bad = private_imports(product_modules())
    assert not bad, "private names imported (make the name public or move it):\n" + "\n".join(bad)


def test_the_circle_and_private_checks_can_fail(tmp_path):
    """A two-module circle (one side a TYPE_CHECKING import, one a lazy import, as the planner's
    and its explanation's were) and a private import are both caught."""
    pkg = tmp_path / "operator" / "holmes" / "plan"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "planner.py").write_text("def plan():\n    from .explain import lines\n")
    (pkg / "explain.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .planner import Candidate\n"
    )
    (pkg / "estimate.py").write_text("from holmes.plan.planner import _evaluate, plan\n")
    modules = {module_of(f, tmp_path): f for f in sorted(pkg.glob("*.py"))}
    assert circles(import_graph(modules)) == [["holmes.plan.explain", "holmes.plan.planner"]]
    assert private_imports(modules, tmp_path) == [
        "operator/holmes/plan/estimate.py:1: imports holmes.plan.planner._evaluate"
    ]


# ---- one name, one module ------------------------------------------------------------------------


def shared_file_names(root: Path = REPO) -> dict[str, list[str]]:
    """File names that two of the product's modules share (``__init__``/``__main__`` aside): a
    reader (or a grep, or a traceback) cannot tell ``names.py`` from ``names.py``."""
    where: dict[str, list[str]] = {}
    for folder in PRODUCT:
        for f in sorted((root / folder).rglob("*.py")):
            if f.name not in ("__init__.py", "__main__.py"):
                where.setdefault(f.name, []).append(str(f.relative_to(root)))
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def test_no_two_modules_share_a_file_name():
    shared = shared_file_names()
    assert not shared, "rename one of each so its name says what it holds:\n" + "\n".join(
        f"{name}: {', '.join(paths)}" for name, paths in sorted(shared.items())
    )


def test_the_shared_file_name_check_can_fail(tmp_path):
    for folder in ("contract/holmes/contract", "operator/holmes/operator/core"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "names.py").write_text("")
        (tmp_path / folder / "__init__.py").write_text("")
    assert shared_file_names(tmp_path) == {
        "names.py": ["contract/holmes/contract/names.py", "operator/holmes/operator/core/names.py"]
    }


# ---- tests take shared helpers from helper modules, never from another test file --------------

# main has rewritten test_fabric.pod_root since this branch (it builds on tests/trainer/fakepod.py):
# after the merge it moves into fakepod.py and this set is deleted.


def imports_between_test_files(root: Path = REPO) -> set[tuple[str, str]]:
    """(test file, test module it imports from): what belongs in a helper module instead."""
    found = set()
    for f in sorted((root / "tests").rglob("test_*.py")):
        module = ".".join(f.relative_to(root).with_suffix("").parts)
        for _, source, _name in imported_names(f, module):
            if source.rpartition(".")[2].startswith("test_"):
                found.add((str(f.relative_to(root)), source))
    return found


def test_tests_take_shared_helpers_from_helper_modules():
    found = sorted(imports_between_test_files())
    where = "\n".join(f"{f} imports {m}" for f, m in found)
    assert not found, f"move what these take into a helper module (opfixtures.py, ...):\n{where}"


def test_the_test_import_check_can_fail(tmp_path):
    (tmp_path / "tests" / "plan").mkdir(parents=True)
    (tmp_path / "tests" / "plan" / "test_a.py").write_text("from tests.plan.test_b import helper\n")
    (tmp_path / "tests" / "plan" / "test_b.py").write_text("from .plan_helpers import node\n")
    assert imports_between_test_files(tmp_path) == {("tests/plan/test_a.py", "tests.plan.test_b")}
