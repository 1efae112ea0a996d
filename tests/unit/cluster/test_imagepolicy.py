"""How the node agent runs a pod's container, from its image (localkube.imagepolicy, pure)."""

from __future__ import annotations

import pytest

from localkube.imagepolicy import DEFAULT_HOST_IMAGES, decide, normalize, parse_patterns


@pytest.mark.parametrize(
    ("ref", "full"),
    [
        ("busybox", "docker.io/library/busybox:latest"),
        ("holmes-trainer:0.1.0", "docker.io/library/holmes-trainer:0.1.0"),
        ("me/app", "docker.io/me/app:latest"),
        ("localhost/holmes-operator:0.1.0", "localhost/holmes-operator:0.1.0"),
        ("localhost:5000/x", "localhost:5000/x:latest"),
        ("registry.example/megatron:24.09", "registry.example/megatron:24.09"),
        ("reg.io/a/b@sha256:" + "0" * 64, "reg.io/a/b@sha256:" + "0" * 64),
    ],
)
def test_references_are_normalized_as_docker_and_containerd_do(ref, full):
    assert normalize(ref) == full


def test_a_local_image_runs_as_a_container_whatever_the_host_patterns():
    d = decide("localhost/holmes-trainer:0.1.0", "abc123", ())
    assert (d.kind, d.ref, d.image_id) == ("container", "localhost/holmes-trainer:0.1.0", "abc123")
    assert decide("busybox", "def456", DEFAULT_HOST_IMAGES).kind == "container"


def test_a_missing_localhost_image_is_a_pull_error_even_when_every_image_may_stand_in():
    d = decide("localhost/holmes-trainer:0.1.0", None, ("*",))
    assert d.kind == "pull_error" and "make images" in d.message


def test_other_images_stand_in_only_when_a_host_pattern_matches():
    assert decide("holmes-trainer:0.1.0", None, DEFAULT_HOST_IMAGES).kind == "host"
    assert decide("busybox", None, ("docker.io/library/*",)).kind == "host"  # the normalized name
    d = decide("registry.example/megatron:1", None, ("busybox",))
    assert d.kind == "pull_error"
    assert "LOCALKUBE_HOST_IMAGES" in d.message and "'busybox'" in d.message
    assert decide("x", None, ()).kind == "pull_error"


def test_an_invalid_reference_is_a_pull_error_naming_it():
    d = decide("", None, ("*",))
    assert d.kind == "pull_error" and "InvalidImageName" in d.message


def test_host_patterns_from_the_environment():
    assert parse_patterns(None) == DEFAULT_HOST_IMAGES
    assert parse_patterns("") == ()
    assert parse_patterns(" busybox, registry.example/* ,") == ("busybox", "registry.example/*")
