"""What hack/build-images.sh keys its cache on and puts into the base (holmes_dev.images): the
build context's files as .dockerignore decides, the digest over them, and the Debian packages the
Dockerfile's RUN steps install (the offline build finds them only in the base)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from holmes_dev import images

from tests.helpers.packaging.packaging_helpers import REPO


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A small repository with the project's .dockerignore and Dockerfile."""
    for rel in (
        ".dockerignore",
        "Dockerfile",
        "pyproject.toml",
        "README.md",
        "docker/constraints.txt",
        "contract/pyproject.toml",
        "operator/pyproject.toml",
        "trainer/pyproject.toml",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, tmp_path / rel)
    for rel in (
        "operator/holmes/a.py",
        "operator/holmes/__pycache__/a.cpython-311.pyc",
        "contract/holmes/contract/b.py",
        "trainer/holmes/trainer/c.py",
        "holmes.egg-info/PKG-INFO",
        ".venv/bin/python",
        "tests/test_x.py",
        "docker/print-constraints.py",
        "operator/build/lib/holmes/a.py",  # what a local `pip wheel ./operator` leaves
        "trainer/dist/holmes_train_trainer-0.1.0-py3-none-any.whl",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(rel)
    return tmp_path


def test_context_is_what_dockerignore_lets_through(tree):
    """The three distributions' folders and the pins; not the development root, not what a
    local build left in a folder."""
    assert images.context_files(tree) == [
        "contract/holmes/contract/b.py",
        "contract/pyproject.toml",
        "docker/constraints.txt",
        "operator/holmes/a.py",
        "operator/pyproject.toml",
        "trainer/holmes/trainer/c.py",
        "trainer/pyproject.toml",
    ]


def test_context_of_the_repository_holds_every_package_source_and_no_venv():
    files = images.context_files(REPO)
    assert "operator/holmes/operator/__main__.py" in files
    assert "trainer/holmes/trainer/__main__.py" in files
    assert not [f for f in files if f.startswith((".venv/", ".holmes/", ".git/", "tests/"))]
    assert not [f for f in files if "__pycache__" in f or ".egg-info" in f]


def test_digest_follows_sources_dockerfile_and_ignores_caches(tree):
    before = images.digest(tree)
    (tree / "operator/holmes/__pycache__/a.cpython-311.pyc").write_text("recompiled")
    (tree / "tests/test_x.py").write_text("a test changed")
    assert images.digest(tree) == before, "files outside the build context changed the key"
    (tree / "operator/holmes/a.py").write_text("changed")
    after_source = images.digest(tree)
    assert after_source != before
    (tree / "Dockerfile").write_text((tree / "Dockerfile").read_text() + "\n# a comment\n")
    assert images.digest(tree) != after_source
    (tree / "trainer/holmes/trainer/new.py").write_text("")
    assert images.digest(tree) not in (before, after_source)


def test_apt_packages_of_every_install_once_without_options():
    dockerfile = (
        "FROM x AS a\n"
        "RUN apt-get update \\\n"
        " && apt-get install -y --no-install-recommends python3 libibverbs1 \\\n"
        " && rm -rf /var/lib/apt/lists/*\n"
        "FROM x AS b\n"
        "RUN apt-get update && apt-get install -y python3 ibverbs-utils; echo apt-get install-ish\n"
        "# RUN apt-get install commented-out\n"
    )
    assert images.apt_packages(dockerfile) == ["python3", "libibverbs1", "ibverbs-utils"]


def test_apt_packages_of_the_project_dockerfile_include_the_rdma_stack():
    pkgs = images.apt_packages((REPO / "Dockerfile").read_text())
    assert {"python3", "python3-venv", "libibverbs1", "librdmacm1", "ibverbs-providers"} <= set(pkgs)


def test_image_names_follow_the_package_version():
    assert images.image_ref("operator") == f"localhost/holmes-operator:{images.version()}"
    with pytest.raises(ValueError, match="operator, trainer"):
        images.image_ref("labeller")


def test_wheelhouse_requirements_are_the_distributions_dependencies_once():
    """What the offline build's wheelhouse holds: every distribution's requirements, once, and not
    the distributions themselves (the Dockerfile builds those from their folders)."""
    reqs = images.requirements()
    assert len(reqs) == len(set(reqs))
    assert not [r for r in reqs if r.lower().startswith("holmes-train")]
    for d in images.distributions().values():
        assert {r for r in d["dependencies"] if not r.startswith("holmes-train")} <= set(reqs), d["name"]
    assert any(r.startswith("torch==") for r in reqs) and any(r.startswith("kopf==") for r in reqs)


def test_frameworks_image_installs_the_test_extras_pins():
    """The tests' frameworks image (hack/build-frameworks-image.sh) runs the frameworks at the
    versions the venv does: the root pyproject's test-extra pins, one per framework."""
    reqs = images.framework_requirements(REPO)
    assert [r.split("==")[0] for r in reqs] == list(images.FRAMEWORKS)
    assert all(r.count("==") == 1 for r in reqs), reqs


def test_test_images_name_their_containerfile_and_refuse_an_unknown_name():
    for name, containerfile in images.TEST_IMAGES.items():
        assert (REPO / containerfile).is_file(), containerfile
        assert images.test_image_ref(name, REPO) == f"localhost/holmes-test-{name}:{images.version(REPO)}"
    with pytest.raises(ValueError, match="the tests' images are frameworks"):
        images.test_image_ref("megatron")
