"""The three distributions (contract/, operator/, trainer/, each with its own pyproject.toml) and
the development root that ties them: names that clash with nothing on PyPI, one version, the
dependencies split by side, packages found by discovery (no hand-kept list), `holmes` a PEP 420
namespace (the wheels built: tests/integration/packaging/test_distributions.py)."""

from __future__ import annotations

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
