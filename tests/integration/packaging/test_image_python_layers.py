"""The Python layers of both images, built the way the Dockerfile builds them, minus Docker.

- operator: the `wheel` stage's `pip wheel` of the three distributions on exactly the files the
  build context sends (the COPY sources filtered by .dockerignore), then the `operator-venv`
  stage's install of the contract's and the operator's wheels with docker/constraints.txt into a
  fresh venv: it must resolve with those pins, pull no torch, and `python -m holmes.operator
  --help` (the image's ENTRYPOINT) must run.
- trainer: pip resolves the contract's and the trainer's wheels with the same pins for the
  trainer image's platform (Ubuntu 24.04: CPython 3.12, manylinux x86_64) without installing them
  (torch's CUDA wheels are gigabytes): torch 2.13.0 must be the CUDA 13 build with its NCCL, and
  no kopf or Kubernetes client comes along.
Both use PyPI, which `make venv` needs anyway.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.helpers.packaging.packaging_helpers import REPO, dockerignore_excludes, run

CONSTRAINTS = REPO / "docker" / "constraints.txt"
WHEEL_STAGE_SOURCES = ("contract", "operator", "trainer")  # the wheel stage's COPY sources

pytestmark = pytest.mark.timeout(600)  # pip installs into fresh environments


def build_context(dest: Path) -> None:
    """What `COPY <src>` in the wheel stage receives: the sources minus .dockerignore."""
    for src in WHEEL_STAGE_SOURCES:
        root = REPO / src
        files = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for f in files:
            rel = f.relative_to(REPO).as_posix()
            if dockerignore_excludes(rel):
                continue
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, dest / rel)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """Distribution name -> its wheel, built as the wheel stage builds them."""
    ctx = tmp_path_factory.mktemp("context")
    build_context(ctx)
    assert not list(ctx.rglob("__pycache__")), ".dockerignore let caches into the build context"
    out = tmp_path_factory.mktemp("wheels")
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out)]
        + [str(ctx / src) for src in WHEEL_STAGE_SOURCES],
        timeout=300,
    )
    built = {w.name.split("-")[0].replace("_", "-"): w for w in out.glob("*.whl")}
    assert set(built) == {"holmes-train-contract", "holmes-train-operator", "holmes-train-trainer"}
    return built


def test_operator_layer_installs_with_the_pins_and_runs(wheels, tmp_path):
    env_dir = tmp_path / "opt-holmes"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-c",
            str(CONSTRAINTS),
            str(wheels["holmes-train-contract"]),
            str(wheels["holmes-train-operator"]),
        ],
        timeout=500,
    )
    frozen = {
        line.split("==")[0].lower().replace("_", "-")
        for line in run([str(py), "-m", "pip", "freeze", "--exclude-editable"]).stdout.splitlines()
        if "==" in line
    }
    assert "torch" not in frozen and "numpy" not in frozen, (
        "the operator image must not carry the trainer's deps"
    )
    assert {"kopf", "kubernetes", "prometheus-client"} <= frozen
    pinned = {line.split("==")[0] for line in CONSTRAINTS.read_text().splitlines() if "==" in line}
    unpinned = frozen - pinned - set(wheels) - {"pip", "setuptools"}
    assert not unpinned, (
        f"the operator image installs packages docker/constraints.txt does not pin: {unpinned}"
    )
    # the image's ENTRYPOINT, run from the image's venv (outside the repository, so only the
    # installed wheel can be imported)
    res = subprocess.run(
        [str(py), "-m", "holmes.operator", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "--all-namespaces" in res.stdout and "--liveness" in res.stdout
    # the chart's NIC labeller DaemonSet runs the same image with another module
    res = subprocess.run(
        [str(py), "-m", "holmes.labeller", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0 and "--sysfs-root" in res.stdout, res.stderr


def test_trainer_layer_resolves_for_the_cuda_image(wheels, tmp_path):
    report = tmp_path / "report.json"
    # --isolated: ignore this machine's pip configuration (its local CPU torch wheel)
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--isolated",
            "--dry-run",
            "--quiet",
            "--ignore-installed",
            "--report",
            str(report),
            "--python-version",
            "3.12",
            *[f"--platform=manylinux_2_{v}_x86_64" for v in range(28, 16, -1)],
            "--platform=manylinux2014_x86_64",
            "--only-binary=:all:",
            "--target",
            str(tmp_path / "t"),
            "-c",
            str(CONSTRAINTS),
            str(wheels["holmes-train-contract"]),
            str(wheels["holmes-train-trainer"]),
        ],
        timeout=500,
    )
    got = {
        i["metadata"]["name"].lower(): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert got["torch"] == "2.13.0", got.get("torch")
    assert any(n.startswith("nvidia-nccl") for n in got), "torch from PyPI must bring NCCL"
    assert {"holmes-train-contract", "holmes-train-trainer", "numpy"} <= set(got)
    assert not {"kopf", "kubernetes", "holmes-train-operator"} & set(got), sorted(got)
