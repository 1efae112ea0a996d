"""Running the operator as a real subprocess against the local cluster (the tests and bench/
share it; a harness like the rest of localkube, not part of the holmes package)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from holmes_dev.kubectl import require_established, run_kubectl
from holmes_dev.ports import free_port

from .controlplane import binary
from .hollow_nodes import KWOK_MANAGED, KWOK_NODE

REPO = Path(__file__).resolve().parents[2]  # hack/localkube/this.py -> the repository
CRD = REPO / "crds" / "holmesjob.yaml"
# The default topology advertises some RDMA nodes through NFD labels only, which cannot tell
# InfiniBand from RoCE: tell the operator what the admin knows about each cluster.
RDMA_KINDS = ("east=infiniband", "west=roce")
# hostNetwork pods share their node's network namespace: per-attempt ports (pods in namespaces
# of their own would not need them).
PORT_RANGE = "20000-29999"


FAKE_KINDS = (("infiniband", "fake-a", 200), ("roce", "fake-b", 200), ("ethernet", "fake-c", 100))


def api_node(name: str, labels: dict[str, str], allocatable: dict[str, str], taint: dict[str, str]) -> dict:
    """A hollow Node for ``hollow.register``: the cluster's kwok renews its Lease, reports it
    Ready and its bound pods Running, and runs nothing. ``taint`` keeps pods that do not
    tolerate it off the node."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **labels},
            "annotations": {KWOK_NODE: KWOK_MANAGED},
        },
        "spec": {"taints": [taint]},
        "status": {
            "capacity": allocatable,
            "allocatable": allocatable,
            # Ready from the start, as a kubelet registers; kwok keeps it so from then on
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "Registered", "message": "played by kwok"}
            ],
        },
    }


def fake_gpu_node(i: int) -> dict:
    """An 8-GPU hollow node (for measuring and crashing the operator at scale). Tainted, and
    labelled holmes.dev/fake=1 so jobs select it explicitly."""
    nic, cluster, gbps = FAKE_KINDS[i % 3]
    alloc = {"cpu": "128", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}
    if nic != "ethernet":
        alloc[f"rdma/fake_{nic}"] = "1k"
    labels = {
        "holmes.dev/fake": "1",
        "holmes.dev/nic": nic,
        "holmes.dev/nic-gbps": str(gbps),
        "holmes.dev/cluster": cluster,
    }
    return api_node(
        f"fake-{i:04d}", labels, alloc, {"key": "holmes.dev/fake", "value": "1", "effect": "NoSchedule"}
    )


CRD_NAME = "holmesjobs.holmes.dev"


def install_crd(kubeconfig: str | Path) -> None:
    """Apply the HolmesJob CRD (with its CEL rules: the server runs them) on the cluster of
    ``kubeconfig`` and wait until it is served; RuntimeError saying why if it is not."""
    kubectl = binary("kubectl")
    r = run_kubectl(kubectl, str(kubeconfig), "apply", "-f", str(CRD))
    if r.returncode:
        raise RuntimeError(f"kubectl apply -f {CRD} failed: {r.stderr.strip()}")
    require_established(kubectl, str(kubeconfig), CRD_NAME)


class OperatorProcess:
    """python -m holmes.operator in a subprocess, with its own ports and log file."""

    def __init__(
        self,
        kubeconfig: str,
        namespaces: list[str] | None,
        log_path: Path,
        extra: list[str] = (),
        port_range: str | None = PORT_RANGE,  # None: every attempt on the fixed ports
        env: dict[str, str] | None = None,  # added to this process's environment
    ):
        self.kubeconfig, self.namespaces, self.log_path = kubeconfig, namespaces, log_path
        self.extra, self.port_range, self.env = list(extra), port_range, dict(env or {})
        self.metrics_port, self.liveness_port = free_port(), free_port()
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 60) -> OperatorProcess:
        scope = [f"--namespace={n}" for n in self.namespaces] if self.namespaces else ["--all-namespaces"]
        cmd = [
            sys.executable,
            "-m",
            "holmes.operator",
            f"--kubeconfig={self.kubeconfig}",
            *scope,
            f"--metrics-port={self.metrics_port}",
            f"--liveness=http://127.0.0.1:{self.liveness_port}/healthz",
            *[f"--cluster-rdma-kind={k}" for k in RDMA_KINDS],
            *([f"--port-range={self.port_range}"] if self.port_range else []),
            *self.extra,
        ]
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            cmd,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env},
        )
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"operator not live after {timeout}s:\n{self.tail()}")

    def healthz(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=2) as r:
            return json.loads(r.read() or b"{}")

    def health_code(self) -> int:
        """The health endpoint's HTTP status (500 once a probe handler fails, 0 unreachable)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.liveness_port}/healthz", timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return 0

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
            return r.read().decode()

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, like a crashed or OOM-killed operator."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if getattr(self, "log", None):
            self.log.close()

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """User + system CPU time the operator has used so far."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0
