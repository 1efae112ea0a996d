"""`make release` (hack/release.py), without building images: the packaged chart at the release's
version, the krew archive, one CycloneDX SBOM per image listing exactly what its venv installs
(the trainer's CUDA, cuDNN and NCCL wheels as the pinned torch requires them), the images' ids
and digests where `make images` built them, the bases and whether each is pinned by digest, and
sha256 sums of every file."""

from __future__ import annotations

import hashlib
import json
import tarfile

import pytest
import release
import yaml

from holmes.contract.release import RELEASE


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    assert release.main(["--out", str(out)]) == 0
    return out, json.loads((out / f"release-{RELEASE}.json").read_text())


def components(path) -> dict[str, str]:
    doc = json.loads(path.read_text())
    assert (doc["bomFormat"], doc["specVersion"]) == ("CycloneDX", "1.6")
    return {c["name"].lower(): c["version"] for c in doc["components"]}


def test_the_chart_is_packaged_at_the_release_version(built):
    out, record = built
    chart = out / f"holmes-{RELEASE}.tgz"
    with tarfile.open(chart) as tar:
        meta = yaml.safe_load(tar.extractfile("holmes/Chart.yaml").read())
        names = tar.getnames()
    assert meta["version"] == meta["appVersion"] == RELEASE
    assert "holmes/files/crds/holmesjob.yaml" in names and "holmes/values.schema.json" in names
    assert record["files"][chart.name] == hashlib.sha256(chart.read_bytes()).hexdigest()


def test_every_file_has_its_sha256_recorded(built):
    out, record = built
    assert set(record["files"]) == {
        f"holmes-{RELEASE}.tgz",
        f"kubectl-holmes-v{RELEASE}.tar.gz",
        f"holmes-operator-{RELEASE}.cdx.json",
        f"holmes-trainer-{RELEASE}.cdx.json",
    }
    sums = dict(reversed(line.split("  ")) for line in (out / "SHA256SUMS").read_text().splitlines())
    assert sums == record["files"]
    for name, digest in record["files"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name


def test_each_images_sbom_lists_what_its_venv_installs(built):
    out, _ = built
    pins = release.constraints()
    operator = components(out / f"holmes-operator-{RELEASE}.cdx.json")
    assert operator["holmes-train-operator"] == operator["holmes-train-contract"] == RELEASE
    assert (
        operator["kopf"] == pins["operator"]["kopf"]
        and operator["kubernetes"] == pins["operator"]["kubernetes"]
    )
    assert not {"torch", "holmes-train-trainer"} & set(operator)
    trainer = components(out / f"holmes-trainer-{RELEASE}.cdx.json")
    assert trainer["holmes-train-trainer"] == RELEASE and trainer["torch"] == "2.13.0"
    # torch's CUDA 13 build's libraries, as torch 2.13.0's own metadata pins them on Linux
    assert trainer["nvidia-nccl-cu13"] == "2.29.7" and trainer["nvidia-cudnn-cu13"] == "9.20.0.48"
    assert not {"kopf", "kubernetes", "holmes-train-operator"} & set(trainer)


def test_images_and_bases_are_recorded(built, monkeypatch):
    _, record = built
    for image in ("operator", "trainer"):
        got = record["images"][image]
        assert got == "not built (make images)" or (
            got["ref"] == f"localhost/holmes-{image}:{RELEASE}" and got["id"].startswith("sha256:")
        ), got
    assert record["bases"]["PYTHON_IMAGE"] == {"ref": "python:3.11.14-slim-bookworm", "pinned": False}
    digest = "python:3.11.14-slim-bookworm@sha256:" + "a" * 64
    monkeypatch.setenv("PYTHON_IMAGE", digest)
    assert release.bases()["PYTHON_IMAGE"] == {"ref": digest, "pinned": True}


def test_require_images_refuses_without_them_naming_the_fix(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(release, "built_image", lambda image: None)
    monkeypatch.setattr(release, "sbom", lambda image, pins, out: out / "x")
    assert release.main(["--out", str(tmp_path), "--require-images"]) == 1
    assert (
        f"no localhost/holmes-operator:{RELEASE} in the local containers storage: run `make images` first"
        in (capsys.readouterr().err)
    )
