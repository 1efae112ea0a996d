"""The three distributions (contract/, operator/, trainer/, each with its own pyproject.toml) and
the development root that ties them: names that clash with nothing on PyPI, one version, the
dependencies split by side, packages found by discovery (no hand-kept list), `holmes` a PEP 420
namespace, and wheels that hold every module of their folder and nothing else."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from holmes_dev import images
from packaging.requirements import Requirement

from tests.helpers.packaging.packaging_helpers import REPO

ROOT = tomllib.loads((REPO / "pyproject.toml").read_text())
DISTS = images.distributions(REPO)  # folder -> [project]
SIDES = {
    "contract": "holmes-train-contract",
    "operator": "holmes-train-operator",
    "trainer": "holmes-train-trainer",
}


def names(reqs: list[str]) -> dict[str, Requirement]:
    return {Requirement(r).name.lower().replace("_", "-"): Requirement(r) for r in reqs}


def setuptools_config(folder: str) -> dict:
    return tomllib.loads((REPO / folder / "pyproject.toml").read_text()).get("tool", {}).get("setuptools", {})


def test_three_distributions_named_apart_from_pypis_holmes():
    """`holmes` on PyPI is an unrelated project: each distribution's name is its own."""
    assert {f: d["name"] for f, d in DISTS.items()} == SIDES
    assert ROOT["project"]["name"] == "holmes-train-dev"


def test_one_version_and_the_contract_pinned_to_it():
    """Both sides read one spec: each pins the contract at the version they all carry."""
    version = ROOT["project"]["version"]
    assert {d["version"] for d in DISTS.values()} == {version}
    for side in ("operator", "trainer"):
        contract = names(DISTS[side]["dependencies"])["holmes-train-contract"]
        assert str(contract.specifier) == f"=={version}", f"{side}: {contract}"
    root_deps = names(ROOT["project"]["dependencies"])
    assert set(root_deps) == set(SIDES.values())
    assert {str(r.specifier) for r in root_deps.values()} == {f"=={version}"}


def test_dependencies_split_by_side():
    """The trainer's distribution has no Kubernetes client, kopf or Jinja2 of its own (torch
    brings Jinja2); the operator's no torch; the contract only PyYAML."""
    contract, operator, trainer = (set(names(DISTS[f]["dependencies"])) for f in SIDES)
    assert contract == {"pyyaml"}
    assert not trainer & {"kopf", "kubernetes", "jinja2", "holmes-train-operator"}, trainer
    assert not operator & {"torch", "numpy", "safetensors", "tokenizers", "holmes-train-trainer"}, operator
    assert "torch" in trainer and "kopf" in operator


def test_packages_are_discovered_not_listed():
    """No hand-kept package list: each distribution finds the packages under its folder, whose
    root is the folder itself (so an editable install is one .pth line static tools follow)."""
    for folder in SIDES:
        cfg = setuptools_config(folder)
        assert "packages" in cfg and set(cfg["packages"]) == {"find"}, f"{folder}: {cfg.get('packages')}"
        assert cfg.get("package-dir") == {"": "."}, f"{folder}: {cfg.get('package-dir')}"
    assert ROOT["tool"]["setuptools"]["packages"] == [], "the root ships no code"


def test_holmes_is_a_pep420_namespace():
    """No distribution owns `holmes`: an __init__.py in one folder would hide the other two."""
    for folder in SIDES:
        assert (REPO / folder / "holmes").is_dir(), folder
        assert not (REPO / folder / "holmes" / "__init__.py").exists(), f"{folder}/holmes/__init__.py"


def test_mypy_bases_are_the_distributions():
    """mypy's one list (it maps a file to its module only from listed bases) names exactly the
    folders that hold a distribution."""
    assert sorted(ROOT["tool"]["mypy"]["mypy_path"]) == sorted(DISTS)


def test_mypy_ignores_no_modules_errors():
    """Every module is type-checked: a module's errors are fixed, not switched off (issue 47)."""
    mypy = ROOT["tool"]["mypy"]
    assert not mypy.get("ignore_errors")
    assert [o["module"] for o in mypy.get("overrides", []) if o.get("ignore_errors")] == []
    inline = [
        str(f.relative_to(REPO))
        for folder in DISTS
        for f in (REPO / folder / "holmes").rglob("*.py")
        if "mypy: ignore-errors" in f.read_text()
    ]
    assert inline == []


def built_wheel(folder: str, out: Path, add: dict[str, str] | None = None) -> Path:
    """The folder's wheel, built from a copy (an in-tree build leaves build/ behind), with the
    files ``add`` names (path in the folder -> text) put in first."""
    src = out / "src" / folder
    shutil.copytree(
        REPO / folder, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    )
    for rel, text in (add or {}).items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    done = subprocess.run(
        [*cmd, "--wheel-dir", str(out), str(src)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (whl,) = out.glob(f"{DISTS[folder]['name'].replace('-', '_')}-*.whl")
    return whl


def shipped_modules(whl: Path) -> set[str]:
    with zipfile.ZipFile(whl) as z:
        return {n for n in z.namelist() if n.startswith("holmes/") and n.endswith(".py")}


@pytest.mark.slow  # pip builds a wheel (3 s)
@pytest.mark.parametrize("folder", sorted(SIDES))
def test_the_wheel_holds_every_module_of_its_folder(folder, tmp_path):
    """Every module of the folder is in its wheel, and nothing of another side."""
    shipped = shipped_modules(built_wheel(folder, tmp_path))
    source = {
        p.relative_to(REPO / folder).as_posix()
        for p in (REPO / folder / "holmes").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert shipped == source, f"missing: {sorted(source - shipped)}; extra: {sorted(shipped - source)}"


@pytest.mark.slow  # pip builds a wheel (3 s)
def test_a_new_subpackage_ships_without_an_entry(tmp_path):
    """The single wheel's hand-kept package list once left a new subpackage out of the wheel
    while the editable checkout imported it; discovery ships it."""
    add = {"holmes/contract/extra/__init__.py": "", "holmes/contract/extra/more.py": "X = 1\n"}
    shipped = shipped_modules(built_wheel("contract", tmp_path, add))
    assert set(add) <= shipped
    assert "holmes/contract/layout.py" in shipped
