"""How the node agent runs a pod's container, decided from its `image` alone (pure: the lookup in
the local containers storage is passed in).

This machine has no registry, so nothing is ever pulled. Three outcomes:

- ``container``: the image is in the local containers storage (`podman images`; `make images`
  builds localhost/holmes-*): it runs as a real OCI container (container.py).
- ``host``: the reference matches one of the agent's host-image patterns (cluster.json
  ``hostImages``, set from ``LOCALKUBE_HOST_IMAGES`` at `localkube up`; default ``*``): the
  tests' and the demo's stand-in images (``busybox``, ``holmes-trainer:0.1.0``,
  ``registry.example/...``) run the pod's command as a host process from the repository's venv,
  so they test the working tree, not the last image build. The pod's status says so (imageID
  ``localkube://host-process``) and an Event names the pattern.
- ``pull_error``: anything else, as a kubelet that cannot pull reports it (ErrImagePull, then
  ImagePullBackOff, retried). A ``localhost/`` reference never falls back to the host: it names
  the local storage itself, so a missing one is a build that did not happen, not a stand-in.

References are normalized the way Docker and containerd do (``busybox`` is
``docker.io/library/busybox:latest``) before the lookup, so a short name never matches a
``localhost/`` image by podman's own short-name search.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

LOCAL_DOMAIN = "localhost"
DEFAULT_HOST_IMAGES = ("*",)
HOST_IMAGE_ID = "localkube://host-process"


def normalize(ref: str) -> str:
    """The fully qualified reference: a domain (docker.io when the first path component is not
    one), ``library/`` for docker.io's single-component names, ``:latest`` without tag or digest."""
    if not ref or ref != ref.strip() or any(c.isspace() for c in ref):
        raise ValueError(f"image reference {ref!r} is empty or holds whitespace")
    name, at, digest = ref.partition("@")
    first, slash, rest = name.partition("/")
    if slash and ("." in first or ":" in first or first == LOCAL_DOMAIN):
        domain, path = first, rest
    else:
        domain, path = "docker.io", name
    if domain == "docker.io" and "/" not in path:
        path = "library/" + path
    if not at and ":" not in path.rsplit("/", 1)[-1]:
        path += ":latest"
    return f"{domain}/{path}{at}{digest}"


def domain(ref: str) -> str:
    return normalize(ref).split("/", 1)[0]


@dataclass(frozen=True)
class Decision:
    kind: str  # "container" | "host" | "pull_error"
    ref: str  # the normalized reference
    message: str = ""
    image_id: str = ""  # "container": the local image's id


def decide(image: str, local_id: str | None, host_images: tuple[str, ...] | list[str]) -> Decision:
    """``local_id``: the id of ``normalize(image)`` in the local containers storage, None when
    it is not there. ``host_images``: fnmatch patterns, matched against the reference as the pod
    writes it and normalized."""
    try:
        ref = normalize(image)
    except ValueError as e:
        return Decision("pull_error", image, f"InvalidImageName: {e}")
    if local_id:
        return Decision("container", ref, f"image {ref} is in the local containers storage", local_id)
    if domain(image) == LOCAL_DOMAIN:
        return Decision(
            "pull_error",
            ref,
            f"image {ref} is not in the local containers storage and localhost/ cannot be pulled from "
            f"anywhere: build it (`make images` builds localhost/holmes-operator and "
            f"localhost/holmes-trainer; `podman images` lists what is there)",
        )
    for pattern in host_images:
        if fnmatch.fnmatchcase(image, pattern) or fnmatch.fnmatchcase(ref, pattern):
            return Decision(
                "host",
                ref,
                f"image {image} stands in for the host's environment (node agent hostImages pattern "
                f"{pattern!r}): the command runs as a host process from the repository's venv",
            )
    patterns = ", ".join(repr(p) for p in host_images) or "none"
    return Decision(
        "pull_error",
        ref,
        f"image {ref} is not in the local containers storage and the local node agent pulls nothing; "
        f"its hostImages patterns ({patterns}) do not match it either: build or import it "
        f"(`podman images` lists what is there), or start the cluster with LOCALKUBE_HOST_IMAGES "
        f"naming it to run its command on the host",
    )


def parse_patterns(raw: str | None) -> tuple[str, ...]:
    """``LOCALKUBE_HOST_IMAGES``: comma-separated patterns; unset: the default; empty: none."""
    if raw is None:
        return DEFAULT_HOST_IMAGES
    return tuple(p.strip() for p in raw.split(",") if p.strip())
