"""Each built image holds only its side, read from the images `make images` built (their files,
through the containers storage's read-only mount): the operator image the contract and the
operator, no trainer and no torch; the trainer image the contract and the trainer, no operator,
no kopf, no Kubernetes client. Needs root and the images (make test builds them before pytest)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from holmes_dev import images

# What each image's venv must hold (distributions, `holmes` subpackages) and must not.
EXPECT = {
    "operator": (
        {"holmes-train-contract", "holmes-train-operator", "kopf", "kubernetes"},
        {"holmes-train-trainer", "torch", "numpy", "jinja2"},  # Jinja2 came with the old single wheel
        {"contract", "operator", "plan", "labeller", "view"},
        {"trainer", "launch"},
    ),
    "trainer": (
        {"holmes-train-contract", "holmes-train-trainer", "torch"},
        {"holmes-train-operator", "kopf", "kubernetes"},  # (torch itself requires Jinja2)
        {"contract", "trainer", "launch"},
        {"operator", "plan", "labeller", "view"},
    ),
}


def site_packages(root: Path) -> Path:
    (found,) = (root / "opt/holmes/lib").glob("python3*/site-packages")
    return found


def contents(site: Path) -> tuple[set[str], set[str]]:
    """(distribution names, subpackages of holmes) installed in one site-packages folder."""
    dists = {p.name.split("-")[0].lower().replace("_", "-") for p in site.glob("*.dist-info")}
    holmes = {p.name for p in (site / "holmes").iterdir() if p.is_dir() and p.name != "__pycache__"}
    return dists, holmes


@pytest.mark.parametrize("target", sorted(EXPECT))
def test_the_image_holds_only_its_side(target):
    ref = images.image_ref(target)
    try:
        mount = subprocess.run(["podman", "image", "mount", ref], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        pytest.fail("podman is not installed: `make images` installs it and builds the images")
    assert mount.returncode == 0, f"{ref}: not built? run `make images` ({mount.stderr.strip()})"
    try:
        dists, holmes = contents(site_packages(Path(mount.stdout.strip())))
    finally:
        subprocess.run(["podman", "image", "unmount", ref], capture_output=True, timeout=120)
    need, refuse, need_pkgs, refuse_pkgs = EXPECT[target]
    assert need <= dists, f"{ref} lacks {sorted(need - dists)}"
    assert not refuse & dists, f"{ref} carries {sorted(refuse & dists)}"
    assert need_pkgs <= holmes and not refuse_pkgs & holmes, f"{ref}: holmes.{sorted(holmes)}"


def test_the_reading_of_an_image_can_fail(tmp_path):
    """The reader sees what a venv holds: a trainer venv that also carries kopf is told apart."""
    site = tmp_path / "opt/holmes/lib/python3.12/site-packages"
    for name in ("holmes_train_contract-0.1.0", "holmes_train_trainer-0.1.0", "torch-2.13.0", "kopf-1.45.2"):
        (site / f"{name}.dist-info").mkdir(parents=True)
    for pkg in ("contract", "trainer", "launch", "__pycache__"):
        (site / "holmes" / pkg).mkdir(parents=True)
    dists, holmes = contents(site_packages(tmp_path))
    assert dists == {"holmes-train-contract", "holmes-train-trainer", "torch", "kopf"}
    assert holmes == {"contract", "trainer", "launch"}
    assert EXPECT["trainer"][1] & dists == {"kopf"}
