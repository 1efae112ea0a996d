"""`make release`: what a platform team pins, in dist/ (or --out DIR):

- the chart, packaged (``helm package``: holmes-VERSION.tgz);
- the kubectl plugin's krew archive and manifest (hack/krew.py);
- one SBOM per image (CycloneDX 1.6 JSON, ``cyclonedx-py requirements``): the Python
  distributions the image's venv installs, at the exact pins of docker/constraints.txt, Holmes'
  own two wheels at this release, and for the trainer the CUDA, cuDNN and NCCL wheels the pinned
  torch requires on Linux (read from the torch installed in this venv: its own metadata);
- each image's id and digest from the local containers storage (``make images`` built them;
  without them a plain run records "not built", ``--require-images`` refuses);
- the bases the images were built from, and whether each is pinned by digest;
- release-VERSION.json listing all of it with sha256 sums, and SHA256SUMS.

A release build pins its bases by digest: resolve the tags once (``docker buildx imagetools
inspect python:3.11.14-slim-bookworm``, or ``skopeo inspect``) and build with
``--build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest>`` (CUDA_IMAGE likewise),
or export PYTHON_IMAGE and CUDA_IMAGE so this script records them; a base given by tag alone is
recorded ``pinned: false``. No image is built here (``make images`` does; on this project's
machines it builds on a local stand-in base, docs/install.md#images, so the digests recorded
here are of those builds, and the bases recorded are the Dockerfile's)."""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "contract"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import krew  # noqa: E402

from holmes.contract.release import RELEASE  # noqa: E402

IMAGES = ("operator", "trainer")
LINUX = {"platform_system": "Linux", "sys_platform": "linux", "platform_machine": "x86_64", "extra": ""}


class ReleaseError(Exception):
    pass


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def helm() -> str:
    for cand in (
        os.environ.get("HELM"),
        str(Path(os.environ.get("HOLMES_CACHE", Path.home() / ".cache/holmes")) / "bin/helm"),
        shutil.which("helm"),
    ):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise ReleaseError("helm not found: run `make clients` (or set HELM=/path/to/helm)")


def package_chart(out: Path) -> Path:
    r = subprocess.run(
        [helm(), "package", str(REPO / "charts/holmes"), "--destination", str(out)],
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise ReleaseError(f"helm package charts/holmes failed: {r.stderr.strip()}")
    chart = out / f"holmes-{RELEASE}.tgz"
    if not chart.exists():
        raise ReleaseError(f"helm package wrote no {chart.name}: is Chart.yaml's version {RELEASE}?")
    return chart


def constraints() -> dict[str, dict[str, str]]:
    """docker/constraints.txt's pins by section: "operator" (with the contract's) and "trainer"."""
    sections: dict[str, dict[str, str]] = {"operator": {}, "trainer": {}}
    current = None
    for line in (REPO / "docker/constraints.txt").read_text().splitlines():
        if line.startswith("# operator"):
            current = "operator"
        elif line.startswith("# trainer"):
            current = "trainer"
        elif line and not line.startswith("#") and current:
            name, _, version = line.partition("==")
            sections[current][name.strip().lower()] = version.strip()
    return sections


def torch_linux_pins(version: str) -> dict[str, str]:
    """The exact pins torch's own metadata requires on Linux x86_64 (the CUDA, cuDNN and NCCL
    wheels), from the torch this venv installed, which must be the image's version."""
    try:
        dist = md.distribution("torch")
    except md.PackageNotFoundError:
        raise ReleaseError("torch is not installed in this venv: `make venv` installs it") from None
    if dist.version.split("+")[0] != version:
        raise ReleaseError(f"this venv has torch {dist.version}, the image pins {version}: run `make venv`")
    out = {}
    for line in dist.requires or []:
        req = Requirement(line)
        pins = [s.version for s in req.specifier if s.operator == "=="]
        if pins and (req.marker is None or req.marker.evaluate(LINUX)):
            out[req.name.lower()] = pins[0]
    return out


def image_pins() -> dict[str, dict[str, str]]:
    """Each image's Python distributions: the contract and its own side (as the Dockerfile installs)."""
    c = constraints()
    ours = {"holmes-train-contract": RELEASE}
    operator = {**c["operator"], **ours, "holmes-train-operator": RELEASE}
    trainer = {"pyyaml": c["operator"]["pyyaml"], **c["trainer"], **ours, "holmes-train-trainer": RELEASE}
    trainer.update(torch_linux_pins(c["trainer"]["torch"]))
    return {"operator": operator, "trainer": trainer}


def sbom(image: str, pins: dict[str, str], out: Path) -> Path:
    path = out / f"holmes-{image}-{RELEASE}.cdx.json"
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    tool = Path(sys.executable).parent / "cyclonedx-py"
    if not tool.exists():
        raise ReleaseError("cyclonedx-py not found next to this python: `make venv` installs cyclonedx-bom")
    try:
        r = subprocess.run(
            [str(tool), "requirements", f.name, "--pyproject", str(REPO / image / "pyproject.toml")]
            + ["--of", "JSON", "--sv", "1.6", "--output-reproducible", "-o", str(path)],
            capture_output=True,
            text=True,
        )
    finally:
        os.unlink(f.name)
    if r.returncode != 0:
        raise ReleaseError(f"cyclonedx-py for the {image} image failed: {r.stderr.strip()[-2000:]}")
    return path


def built_image(image: str) -> dict | None:
    """The image's id and digest in the local containers storage, or None where it is not there."""
    ref = f"localhost/holmes-{image}:{RELEASE}"
    if not shutil.which("podman"):
        return None
    r = subprocess.run(["podman", "image", "inspect", ref], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    (info,) = json.loads(r.stdout)
    return {"ref": ref, "id": f"sha256:{info['Id']}", "digest": info.get("Digest"), "size": info.get("Size")}


def bases() -> dict[str, dict]:
    """The Dockerfile's base ARGs: the environment's (what a release build passes), else the
    Dockerfile's defaults; pinned when given by digest."""
    text = (REPO / "Dockerfile").read_text()
    out = {}
    for arg in ("PYTHON_IMAGE", "CUDA_IMAGE"):
        m = re.search(rf"^ARG {arg}=(\S+)", text, re.M)
        ref = os.environ.get(arg) or (m.group(1) if m else "")
        out[arg] = {"ref": ref, "pinned": bool(re.search(r"@sha256:[0-9a-f]{64}$", ref))}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="hack/release.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=str(REPO / "dist"), help="where to write (default dist/)")
    p.add_argument("--require-images", action="store_true", help="refuse without both images built")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        files = [package_chart(out)]
        archive = out / krew.ARCHIVE
        archive.write_bytes(krew.archive_bytes())
        files.append(archive)
        pins = image_pins()
        images = {}
        for image in IMAGES:
            files.append(sbom(image, pins[image], out))
            images[image] = built_image(image)
            if images[image] is None and args.require_images:
                raise ReleaseError(
                    f"no localhost/holmes-{image}:{RELEASE} in the local containers storage: "
                    "run `make images` first"
                )
    except ReleaseError as e:
        print(f"release: {e}", file=sys.stderr)
        return 1
    record = {
        "version": RELEASE,
        "files": {f.name: sha256(f) for f in files},
        "images": {k: v or "not built (make images)" for k, v in images.items()},
        "bases": bases(),
        "sboms": {image: f"holmes-{image}-{RELEASE}.cdx.json" for image in IMAGES},
    }
    (out / f"release-{RELEASE}.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    (out / "SHA256SUMS").write_text("".join(f"{h}  {n}\n" for n, h in sorted(record["files"].items())))
    for arg, base in record["bases"].items():
        if not base["pinned"]:
            print(
                f"release: {arg}={base['ref']} is a tag, not a digest: "
                "a release build pins it (hack/release.py says how)"
            )
    print(f"release {RELEASE}: {', '.join(sorted(record['files']))} and release-{RELEASE}.json in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
