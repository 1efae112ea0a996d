"""One release version (holmes.contract.release.RELEASE) carried by everything a platform team
pins: the three distributions and the root, the chart's version and appVersion, both images'
OCI version label, the CRD's version label and CHANGELOG.md's latest release. The project is
Apache-2.0 everywhere it says a licence, and LICENSE holds that licence's text."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
import yaml

from holmes.contract.release import RELEASE

REPO = Path(__file__).resolve().parents[3]
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-[0-9A-Za-z.-]+)?$")
PYPROJECTS = [
    "pyproject.toml",
    "contract/pyproject.toml",
    "operator/pyproject.toml",
    "trainer/pyproject.toml",
]
IMAGES = ("operator", "trainer")  # the Dockerfile's final stages


def pyproject(path: str) -> dict:
    return tomllib.loads((REPO / path).read_text())["project"]


def image_labels(dockerfile: str) -> dict[str, dict[str, str]]:
    """stage name -> the labels its LABEL instructions set (continuation lines joined)."""
    text = re.sub(r"\\\n", " ", dockerfile)
    out: dict[str, dict[str, str]] = {}
    stage = None
    for line in text.splitlines():
        if m := re.match(r"^FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.I):
            stage = m.group(1)
            out[stage or ""] = {}
        elif re.match(r"^LABEL\s", line) and stage is not None:
            out[stage].update(re.findall(r'([\w.-]+)="([^"]*)"', line))
    return out


def versions_found() -> dict[str, str]:
    """where -> the version it says."""
    found = {}
    for path in PYPROJECTS:
        project = pyproject(path)
        found[path] = project["version"]
        for dep in project.get("dependencies", []):
            if dep.startswith("holmes-train-"):
                name, _, pinned = dep.partition("==")
                found[f"{path}: {name}"] = pinned
    chart = yaml.safe_load((REPO / "charts/holmes/Chart.yaml").read_text())
    found["Chart.yaml version"] = chart["version"]
    found["Chart.yaml appVersion"] = chart["appVersion"]
    labels = image_labels((REPO / "Dockerfile").read_text())
    for image in IMAGES:
        found[f"Dockerfile {image}"] = labels[image].get("org.opencontainers.image.version", "(no label)")
    crd = yaml.safe_load((REPO / "crds/holmesjob.yaml").read_text())
    found["crds/holmesjob.yaml"] = crd["metadata"]["labels"].get("app.kubernetes.io/version", "(no label)")
    found["CHANGELOG.md"] = latest_release((REPO / "CHANGELOG.md").read_text())
    return found


def latest_release(changelog: str) -> str:
    """The first '## [X.Y.Z] - date' heading's version."""
    m = re.search(r"^## \[(\d[^\]]*)\] - \d{4}-\d{2}-\d{2}$", changelog, re.M)
    return m.group(1) if m else "(no release heading)"


def test_release_is_semver():
    assert SEMVER.match(RELEASE), RELEASE


def test_every_pinned_thing_carries_the_release():
    wrong = {where: v for where, v in versions_found().items() if v != RELEASE}
    assert not wrong, f"not {RELEASE} (holmes.contract.release.RELEASE): {wrong}"


def test_image_labels_are_read_per_stage():
    """The reader itself: a label set in an earlier stage is not the final image's."""
    labels = image_labels(
        'FROM a AS build\nLABEL org.opencontainers.image.version="9"\nFROM b AS operator\n'
        'LABEL x="1" \\\n      org.opencontainers.image.version="2"\n'
    )
    assert labels == {
        "build": {"org.opencontainers.image.version": "9"},
        "operator": {"x": "1", "org.opencontainers.image.version": "2"},
    }


def test_licence_is_apache_2_everywhere():
    text = (REPO / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text  # the whole text, not a pointer to it
    for path in PYPROJECTS:
        assert pyproject(path)["license"] == "Apache-2.0", path
    labels = image_labels((REPO / "Dockerfile").read_text())
    for image in IMAGES:
        assert labels[image]["org.opencontainers.image.licenses"] == "Apache-2.0", image


def test_the_trainer_says_its_release(capsys):
    from holmes.trainer.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"holmes-train-trainer {RELEASE}"
