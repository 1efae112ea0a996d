"""The import rules import-linter cannot state, and import-linter's contracts themselves.

The layers (which part of ``holmes`` may import which, no circles, the pure core's and views'
lack of I/O, no torch on the operator side, no Kubernetes client in the trainer) are contracts in
pyproject.toml's ``[tool.importlinter]``, run by ``lint-imports`` (``make lint``) and by
:func:`test_the_import_contracts_hold`; :func:`test_the_import_contracts_can_fail` breaks each
one in a probe package. What stays here: the third-party packages each folder may use (an
allow-list; import-linter forbids, it does not allow), no module importing another one's private
name, one file name per module, and tests sharing helpers through helper modules. Parsed, not
imported, so a lazy import inside a function counts too."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tests.conftest import TIERS  # the first folder under tests/

REPO = Path(__file__).resolve().parents[3]
STDLIB = set(sys.stdlib_module_names)
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"

# package folder -> the top-level third-party modules it may import (README.md's table); which
# Holmes packages it may import is import-linter's
THIRD_PARTY = {
    "contract/holmes/contract": {"yaml"},
    "operator/holmes/plan": {"yaml"},
    "operator/holmes/labeller": {"kubernetes"},
    "operator/holmes/operator": {"kopf", "kubernetes", "urllib3", "prometheus_client", "yaml"},
    "operator/holmes/view": set(),  # pictures and text of layouts and jobs, for people
    "operator/holmes/operator/core": {"yaml"},  # the operator's pure core: no client
    "trainer/holmes/trainer": {"torch", "numpy", "prometheus_client", "tokenizers", "safetensors"},
    # copied into pods of the user's own image: nothing but the standard library and its torch
    "trainer/holmes/launch": {"torch"},
    "operator/holmes/cli.py": {"kubernetes", "yaml"},  # `holmes plan`; the client for --kubeconfig
    "operator/holmes/kubectl_holmes.py": {"kubernetes"},
}

PRODUCT = ("contract", "operator", "trainer")  # the distributions holding the holmes namespace


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


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(REPO).parts[1:-1])  # e.g. holmes.plan


def third_party_violations(path: Path, allowed: set[str], package: str | None = None) -> list[str]:
    bad = []
    for line, name in imports(path, package or package_of(path)):
        top = name.split(".")[0]
        if top not in STDLIB and top not in ("__future__", "holmes") and top not in allowed:
            bad.append(f"{path.name}:{line}: imports {name}")
    return bad


def files_of(folder: str) -> list[Path]:
    """The modules of one row: a file, or a folder's files less those of nested rows."""
    if folder.endswith(".py"):
        return [REPO / folder]
    nested = [f for f in THIRD_PARTY if f != folder and f.startswith(folder + "/")]
    return [
        f
        for f in sorted((REPO / folder).rglob("*.py"))
        if not any(f.is_relative_to(REPO / n) for n in nested)
    ]


@pytest.mark.parametrize("folder", sorted(THIRD_PARTY))
def test_package_imports_only_the_third_party_packages_its_row_allows(folder):
    files = files_of(folder)
    assert files, f"{folder} holds no Python files"
    bad = [v for f in files for v in third_party_violations(f, THIRD_PARTY[folder])]
    assert not bad, "imports against the dependency table (README.md):\n" + "\n".join(bad)


def test_every_module_has_a_row():
    """A new folder of the namespace gets its own allow-list, not silently none."""
    rows = [REPO / f for f in THIRD_PARTY]
    orphans = [
        str(f.relative_to(REPO))
        for top in PRODUCT
        for f in sorted((REPO / top / "holmes").rglob("*.py"))
        if not any(f == r or f.is_relative_to(r) for r in rows)
    ]
    assert not orphans, "add a THIRD_PARTY row for:\n" + "\n".join(orphans)


def test_the_checker_sees_lazy_and_relative_imports(tmp_path):
    """A checker that misses a function-level import could never fail."""
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    import torch\n    from ..operator import kube\n    import yaml.nodes\n")
    found = third_party_violations(probe, THIRD_PARTY["operator/holmes/plan"], package="holmes.plan")
    assert found == ["probe.py:2: imports torch"]


# ---- import-linter's contracts -------------------------------------------------------------------


def lint_imports(config: Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    assert LINT_IMPORTS.exists(), "lint-imports not installed: make venv (the test extra pins import-linter)"
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(config), "--no-cache", "--no-logo"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "1000", **(env or {})},
    )


def contract_names(config: Path) -> list[str]:
    return [c["name"] for c in tomllib.loads(config.read_text())["tool"]["importlinter"]["contracts"]]


def test_the_import_contracts_hold():
    done = lint_imports(REPO / "pyproject.toml", REPO)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert f"Contracts: {len(contract_names(REPO / 'pyproject.toml'))} kept, 0 broken." in done.stdout


# One import that breaks each contract (by its name's start), in a copy of the namespace called
# holmesprobe: the contracts must see function-level and TYPE_CHECKING imports and the standard
# library, or they could never fail.
PROBE = {
    "contract/__init__.py": "def f():\n    from holmesprobe.plan import a\n",  # upward
    "plan/__init__.py": "",
    "plan/a.py": "from . import b\n",
    "plan/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n",  # circle
    "trainer/__init__.py": "def f():\n    import kubernetes\n",
    "trainer/engine.py": "from .dryrun import recording\n",
    "trainer/dryrun/__init__.py": "",
    "trainer/dryrun/recording.py": "from .. import engine\n",
    "launch/__init__.py": "import holmesprobe.contract\n",
    "operator/__init__.py": "",
    "operator/kube.py": "",
    "operator/core/__init__.py": "import time\n",
    "labeller/__init__.py": "",
    "view/__init__.py": "import torch\nfrom holmesprobe.plan import a\n",
    "cli.py": "from holmesprobe import labeller\n",
    "kubectl_holmes.py": "from holmesprobe.operator.core import x\nfrom holmesprobe.operator import kube\n",
    "operator/core/x.py": "",
}
PROBE_BREAKS = {
    "The product reads one way": "holmesprobe.contract -> holmesprobe.plan.a",
    "No import circle": "No cycles are allowed in holmesprobe.plan.",  # plan.a <-> plan.b
    "The trainer reads the contract only": "holmesprobe.trainer -> kubernetes",
    "The engine does not import its dry run": "holmesprobe.trainer.engine -> holmesprobe.trainer.dryrun",
    "The launcher": "holmesprobe.launch -> holmesprobe.contract",
    "The operator side has no torch": "holmesprobe.view -> torch",
    "The contract and the planner are pure": None,  # kept: the probe's planner imports nothing
    "The views draw": "holmesprobe.view -> holmesprobe.plan.a",
    "The operator's core and the views are pure": "holmesprobe.operator.core -> time",
    "`holmes plan`": "holmesprobe.cli -> holmesprobe.labeller",
    "`kubectl holmes`": "holmesprobe.kubectl_holmes -> holmesprobe.operator.kube",
}


def test_the_import_contracts_can_fail(tmp_path):
    text = (REPO / "pyproject.toml").read_text()
    section = text[text.index("\n[tool.importlinter]\n") : text.index("\n[tool.mypy]\n")]
    probe_config = tmp_path / "importlinter.toml"
    probe_config.write_text(re.sub(r"\bholmes(?=[.\"])", "holmesprobe", section))
    names = contract_names(probe_config)
    for rel, body in PROBE.items():
        (tmp_path / "holmesprobe" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "holmesprobe" / rel).write_text(body)
    done = lint_imports(probe_config, tmp_path, env={"PYTHONPATH": str(tmp_path)})
    out = done.stdout
    assert done.returncode == 1, out[-4000:] + done.stderr[-2000:]
    for name in names:
        (start,) = [s for s in PROBE_BREAKS if name.startswith(s)]
        verdict = "KEPT" if PROBE_BREAKS[start] is None else "BROKEN"
        assert f"{name} {verdict}" in out, f"{name}: not {verdict}\n{out[-4000:]}"
        if PROBE_BREAKS[start]:
            assert PROBE_BREAKS[start] in out, f"{name}: {PROBE_BREAKS[start]} not reported\n{out}"


# ---- no private names ----------------------------------------------------------------------------


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


def private_imports(modules: dict[str, Path], root: Path = REPO) -> list[str]:
    """``from other_module import _name``: a module reaching into another's private name."""
    bad = []
    for m, path in modules.items():
        for line, source, name in imported_names(path, m):
            private = name.startswith("_") and not name.startswith("__")
            if private and source.split(".")[0] == "holmes" and source != m:
                bad.append(f"{path.relative_to(root)}:{line}: imports {source}.{name}")
    return bad


def test_no_module_imports_a_private_name_of_another():
    bad = private_imports(product_modules())
    assert not bad, "private names imported (make the name public or move it):\n" + "\n".join(bad)


def test_the_private_name_check_can_fail(tmp_path):
    pkg = tmp_path / "operator" / "holmes" / "plan"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "planner.py").write_text("def _evaluate():\n    pass\n")
    # a private name is caught; a dunder is not private
    (pkg / "estimate.py").write_text(
        "from holmes.plan.planner import _evaluate, plan\nfrom . import __doc__\n"
    )
    modules = {module_of(f, tmp_path): f for f in sorted(pkg.glob("*.py"))}
    assert private_imports(modules, tmp_path) == [
        "operator/holmes/plan/estimate.py:1: imports holmes.plan.planner._evaluate"
    ]


# ---- one name, one module ------------------------------------------------------------------------


def shared_file_names(root: Path = REPO) -> dict[str, list[str]]:
    """File names that two of the product's modules share (``__init__``/``__main__`` aside): a
    reader (or a grep, or a traceback) cannot tell ``names.py`` from ``names.py``."""
    where: dict[str, list[str]] = {}
    for folder in PRODUCT:
        for f in sorted((root / folder / "holmes").rglob("*.py")):
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


# ---- tests sit in a tier folder and take shared helpers from tests/helpers ------------------------

# what a tier folder holds besides tests: fixtures, package markers, and the sitecustomize.py a
# test puts on a program's path (tests/e2e/operator/wedge, slowdown)
TIER_FILES = {"conftest.py", "__init__.py", "sitecustomize.py"}


def imports_between_test_files(root: Path = REPO) -> set[tuple[str, str]]:
    """(test file, test module it imports from): what belongs in a helper module instead."""
    found = set()
    for f in sorted((root / "tests").rglob("test_*.py")):
        module = ".".join(f.relative_to(root).with_suffix("").parts)
        for _, source, _name in imported_names(f, module):
            if source.rpartition(".")[2].startswith("test_"):
                found.add((str(f.relative_to(root)), source))
    return found


def misplaced_test_modules(root: Path = REPO) -> list[str]:
    """Test files outside a tier folder (``make unit``/``integration``/``e2e`` would miss them), and
    helper modules inside one (a tier cannot import another's: shared helpers go to tests/helpers)."""
    found = []
    for f in sorted((root / "tests").rglob("*.py")):
        parts = f.relative_to(root / "tests").parts
        top = parts[0] if len(parts) > 1 else None  # None: directly in tests/
        if f.name.startswith("test_"):
            wrong = top not in TIERS
        elif top in TIERS:
            wrong = f.name not in TIER_FILES
        else:
            wrong = top != "helpers" and not (top is None and f.name in {"conftest.py", "__init__.py"})
        if wrong:
            found.append(str(f.relative_to(root)))
    return found


def test_tests_take_shared_helpers_from_helper_modules():
    found = sorted(imports_between_test_files())
    where = "\n".join(f"{f} imports {m}" for f, m in found)
    assert not found, f"move what these take into a helper module in tests/helpers:\n{where}"


def test_every_test_is_in_a_tier_and_every_helper_in_tests_helpers():
    found = misplaced_test_modules()
    assert not found, (
        "test files go under tests/unit, tests/integration or tests/e2e (by what they need, "
        "tests/conftest.py), shared helpers under tests/helpers/<area>:\n" + "\n".join(found)
    )


def test_the_test_import_check_can_fail(tmp_path):
    (tmp_path / "tests" / "unit" / "plan").mkdir(parents=True)
    (tmp_path / "tests" / "unit" / "plan" / "test_a.py").write_text(
        "from tests.unit.plan.test_b import helper\n"
    )
    (tmp_path / "tests" / "unit" / "plan" / "test_b.py").write_text("from tests.helpers.plan import node\n")
    assert imports_between_test_files(tmp_path) == {("tests/unit/plan/test_a.py", "tests.unit.plan.test_b")}


def test_the_tier_check_can_fail(tmp_path):
    files = [
        "conftest.py", "__init__.py", "test_loose.py", "loose_helpers.py",
        "unit/conftest.py", "unit/plan/__init__.py", "unit/plan/test_a.py", "unit/plan/plan_helpers.py",
        "e2e/operator/wedge/sitecustomize.py", "helpers/__init__.py", "helpers/plan/plan_helpers.py",
        "helpers/plan/test_b.py", "slow/test_c.py",
    ]  # fmt: skip
    for name in files:
        (tmp_path / "tests" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / name).write_text("")
    assert misplaced_test_modules(tmp_path) == [
        "tests/helpers/plan/test_b.py",
        "tests/loose_helpers.py",
        "tests/slow/test_c.py",
        "tests/test_loose.py",
        "tests/unit/plan/plan_helpers.py",
    ]


# ---- tests import through pytest's pythonpath, never by editing sys.path --------------------------


def sys_path_edits(root: Path = REPO) -> list[str]:
    """Every ``sys.path`` changed in a test module (a call on it, an assignment to it or its
    slice): pyproject's pythonpath (hack, bench) and the editable installs are how tests import."""
    found = []
    for f in sorted((root / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            targets = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                targets = [node.func.value]
            elif isinstance(node, (ast.Assign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                targets = [t.value if isinstance(t, ast.Subscript) else t for t in targets]
            if any(ast.unparse(t) == "sys.path" for t in targets):
                found.append((str(f.relative_to(root)), node.lineno))
    return [f"{f}:{line}" for f, line in sorted(found)]


def test_no_test_edits_sys_path():
    found = sys_path_edits()
    assert not found, "import from hack/ or bench/ directly (pytest's pythonpath):\n" + "\n".join(found)


def test_the_sys_path_check_can_fail(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text(
        "import sys\nsys.path.insert(0, 'bench')\nsys.path[:0] = ['hack']\nsys.path += ['x']\n"
        "print(sys.path[0])\n"
    )
    assert sys_path_edits(tmp_path) == ["tests/test_a.py:2", "tests/test_a.py:3", "tests/test_a.py:4"]
