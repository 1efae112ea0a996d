"""A cluster of its own with real kubelet nodes (hack/localkube/realnode.py), for the tests of
marker ``real_nodes``: started from a topology file, torn down (and checked gone) at the end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from holmes_dev import images
from holmes_dev.kubectl import run_kubectl

from localkube.controlplane import ControlPlane, binary, mentions, pid_alive

REPO = Path(__file__).resolve().parents[3]
TRAINER = images.image_ref("trainer")
FRAMEWORKS = images.test_image_ref("frameworks")  # the framework tests' (`make frameworks-image`)


class Cluster:
    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self.kubeconfig = str(cp.kubeconfig)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120):
        r = run_kubectl(binary("kubectl"), self.kubeconfig, *args, input=input, timeout=timeout)
        if check and r.returncode:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
        return r

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, *objs: dict) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs))

    def node_dir(self, node: str) -> Path:
        """The node's directory (containerd, kubelet, CDI specs) under the cluster's state."""
        return Path(self.cp.state()["realNodes"]["nodes"][node]["dir"])

    def log(self, process: str) -> str:
        """The log of one of the cluster's processes (``dra-plugin-<node>``, ``kubelet-<node>``)."""
        return (self.cp.dir / "logs" / f"{process}.log").read_text(errors="replace")

    def ctr(self, node: str, *args: str) -> str:
        """``ctr`` on the node's containerd, in the kubelet's namespace."""
        sock = self.cp.state()["realNodes"]["nodes"][node]["socket"]
        r = subprocess.run(
            [binary("ctr"), "--address", sock, "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        return r.stdout


def require_real_nodes() -> None:
    """Skip where real nodes cannot run (not root); fail, naming the fix, without the trainer image."""
    if os.geteuid() != 0:
        pytest.skip("real nodes need root")
    require_image(TRAINER, "make images")


def require_image(ref: str, fix: str, why: str = "") -> None:
    """Fail, naming the command that builds it, when ``ref`` is not in the local containers
    storage (where real nodes take their images from)."""
    if shutil.which("podman") is None or subprocess.run(["podman", "image", "exists", ref]).returncode:
        pytest.fail(f"{ref} is not built: run `{fix}`{why}")


def real_cluster(topology: Path, tag: str) -> Iterator[Cluster]:
    """For a module-scoped fixture: the cluster of ``topology``, needing root and the trainer
    image; every process it recorded is gone once it is down."""
    require_real_nodes()
    cp = ControlPlane(REPO / ".holmes" / f"pytest-{tag}-{os.getpid()}")
    cp.dir.mkdir(parents=True, exist_ok=True)
    pids: dict[str, int] = {}
    try:
        cp.up(topology, log=lambda m: print(f"[localkube] {m}", file=sys.stderr, flush=True))
        pids = dict(cp.state().get("pids", {}))
        yield Cluster(cp)
    finally:
        cp.down(log=lambda m: print(f"[localkube] {m}", file=sys.stderr, flush=True))
        shutil.rmtree(cp.dir, ignore_errors=True)
    left = {name: pid for name, pid in pids.items() if pid_alive(pid) and mentions(pid, cp.dir)}
    assert not left, f"still running after the cluster went down: {left}"
