"""The wheels pip builds from each distribution's folder hold every module of it and nothing else,
a new subpackage included (the distributions' metadata: tests/unit/packaging/test_distributions.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from holmes_dev import images

from tests.helpers.packaging.packaging_helpers import REPO

DISTS = images.distributions(REPO)  # folder -> [project]


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


@pytest.mark.parametrize("folder", sorted(DISTS))
def test_the_wheel_holds_every_module_of_its_folder(folder, tmp_path):
    """Every module of the folder is in its wheel, and nothing of another side."""
    shipped = shipped_modules(built_wheel(folder, tmp_path))
    source = {
        p.relative_to(REPO / folder).as_posix()
        for p in (REPO / folder / "holmes").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert shipped == source, f"missing: {sorted(source - shipped)}; extra: {sorted(shipped - source)}"


def test_a_new_subpackage_ships_without_an_entry(tmp_path):
    """The single wheel's hand-kept package list once left a new subpackage out of the wheel
    while the editable checkout imported it; discovery ships it."""
    add = {"holmes/contract/extra/__init__.py": "", "holmes/contract/extra/more.py": "X = 1\n"}
    shipped = shipped_modules(built_wheel("contract", tmp_path, add))
    assert set(add) <= shipped
    assert "holmes/contract/layout.py" in shipped
