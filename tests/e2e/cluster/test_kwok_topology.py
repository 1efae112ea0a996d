"""A mixed topology (hack/topologies/mixed.yaml): two nodes played by the node agent and four
hollow nodes played by kwok (``playedBy: kwok``), started and stopped as ``make cluster-up
TOPOLOGY=...`` and ``make cluster-down`` do (``python -m localkube up|down``). The kwok nodes come
Ready with the topology's labels, annotations, taints and resources, one kwok process plays them
all; a HolmesJob's pods land on them and end as their ``hollow.holmes.dev/*`` annotations say,
while a pod on an agent node runs as a process; ``down`` leaves no kwok process.

Its own cluster (not the session's ``cluster``: another topology)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from holmes_dev.jobs import holmes_job
from holmes_dev.kubectl import run_kubectl

from localkube import hollow_nodes as hn
from localkube.controlplane import ControlPlane, binary, mentions, pid_alive
from localkube.operatorproc import OperatorProcess, install_crd
from localkube.topology import KWOK, load_topology
from tests.helpers.cluster.pods import apply, pod
from tests.helpers.polling import wait_for

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parents[3]
TOPOLOGY = REPO / "hack" / "topologies" / "mixed.yaml"
HOLLOW = [n.name for n in load_topology(TOPOLOGY).played_by(KWOK).nodes]


class Mixed:
    def __init__(self, state: Path):
        self.cp = ControlPlane(state)
        self.kubeconfig = str(self.cp.kubeconfig)
        self.cli = [sys.executable, "-m", "localkube", "--state-dir", str(state)]
        self.env = {**os.environ, "PYTHONPATH": str(REPO / "hack")}

    def localkube(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*self.cli, *args], env=self.env, cwd=REPO, capture_output=True, text=True, timeout=timeout
        )

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60):
        r = run_kubectl(binary("kubectl"), self.kubeconfig, *args, input=input, timeout=timeout)
        if check and r.returncode:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
        return r

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def kwok_processes(self) -> list[int]:
        """Every live kwok process started for this cluster (its command line names the state dir)."""
        kwok = binary("kwok")
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                argv0 = (d / "cmdline").read_bytes().split(b"\0")[0].decode()
            except OSError:
                continue
            if argv0 == kwok and pid_alive(int(d.name)) and mentions(int(d.name), self.cp.dir):
                out.append(int(d.name))
        return out


@pytest.fixture(scope="module")
def mixed():
    c = Mixed(REPO / ".holmes" / f"pytest-kwok-{os.getpid()}")
    c.cp.dir.mkdir(parents=True, exist_ok=True)
    try:
        up = c.localkube("up", "--topology", str(TOPOLOGY), "--kubeconfig-link", str(c.cp.dir / "link"))
        print(up.stdout, up.stderr, file=sys.stderr)
        assert up.returncode == 0, up.stdout + up.stderr
        yield c
    finally:
        c.localkube("down")
        shutil.rmtree(c.cp.dir, ignore_errors=True)


def test_kwok_nodes_carry_the_topology_and_one_kwok_plays_them(mixed):
    topo = load_topology(TOPOLOGY)
    nodes = {n["metadata"]["name"]: n for n in mixed.get("nodes")["items"]}
    assert sorted(nodes) == sorted(topo.names)
    for sim in topo.nodes:
        node = nodes[sim.name]
        ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert ready["Ready"] == "True", node["status"]["conditions"]
        assert sim.labels.items() <= node["metadata"]["labels"].items()
        assert sim.annotations.items() <= node["metadata"]["annotations"].items()
        taints = node["spec"].get("taints") or []
        assert not [t for t in taints if t["key"].startswith("node.kubernetes.io/")], taints
        kwok = node["metadata"]["annotations"].get(hn.KWOK_NODE) == hn.KWOK_MANAGED
        assert kwok == (sim.played_by == KWOK), sim.name
        if sim.played_by == KWOK:
            assert node["status"]["nodeInfo"]["kubeletVersion"] == "kwok"
            assert [{k: t[k] for k in ("key", "value", "effect")} for t in taints] == list(sim.taints)
            alloc = node["status"]["allocatable"]
            assert (alloc["cpu"], alloc["memory"], alloc["nvidia.com/gpu"], alloc["rdma/hca_shared_ib"]) == (
                "192",
                "2Ti",
                "8",
                "1k",
            )
            lease = mixed.get("lease", sim.name, "-n", "kube-node-lease")
            assert lease["spec"]["holderIdentity"] and lease["spec"]["leaseDurationSeconds"] == 8
    st = mixed.cp.state()
    assert st["kwok"]["nodes"] == len(HOLLOW) and st["kwok"]["readyS"] > 0
    assert mixed.kwok_processes() == [st["pids"]["kwok"]]
    assert mixed.cp.running()
    nodes_out = mixed.localkube("nodes")
    assert nodes_out.returncode == 0 and "kwok-3" in nodes_out.stdout, nodes_out.stderr


def _job(name: str, ns: str, count: int, annotations: dict[str, str], backoff: int) -> dict:
    spec = {
        "model": {"layers": 4, "hiddenSize": 256, "attentionHeads": 4, "seqLength": 128, "vocabSize": 1024},
        "training": {"globalBatchSize": 64, "microBatchSize": 1, "iterations": 10, "learningRate": 1e-4},
        "nodes": {"count": count, "gpusPerNode": 8, "selector": {"matchLabels": {"pool": "hollow"}}},
        "template": {
            "metadata": {"annotations": annotations},
            "spec": {
                "tolerations": [
                    {"key": "pool", "operator": "Equal", "value": "hollow", "effect": "NoSchedule"}
                ],
                "containers": [{"name": "trainer", "command": ["sleep", "infinity"]}],
            },
        },
        "runPolicy": {"backoffLimit": backoff},
    }
    return holmes_job(name, spec, ns)


def test_a_holmesjobs_pods_land_on_kwok_nodes_and_end_as_annotated(mixed, tmp_path):
    install_crd(mixed)
    ns = f"t-{uuid.uuid4().hex[:8]}"
    mixed.kubectl("create", "namespace", ns)
    wait_for(
        "the default service account",
        lambda: mixed.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
    )
    op = OperatorProcess(mixed.kubeconfig, [ns], tmp_path / "operator.log").start()
    try:
        jobs = {
            "done": _job("done", ns, 2, {hn.RUN_SECONDS: "2"}, 0),
            "exit3": _job("exit3", ns, 1, {hn.RUN_SECONDS: "1", hn.EXIT_CODE: "3"}, 0),
        }
        mixed.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(jobs.values()))
        # beside them, a pod on an agent node: a process the node agent runs
        apply(mixed, ns, pod("on-agent", "print('agent')", node="eth-0"))

        def ended(name: str):
            job = mixed.get("holmesjob", name, "-n", ns)
            return job if job.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

        got = {
            n: wait_for(
                f"HolmesJob {n} to end",
                lambda n=n: ended(n),
                timeout=120,
                every=1,
                detail=lambda: op.tail(30),
            )
            for n in jobs
        }
        pods = mixed.get("pods", "-n", ns)["items"]
    finally:
        op.stop()
    assert got["done"]["status"]["phase"] == "Succeeded", got["done"]["status"]
    assert got["exit3"]["status"]["phase"] == "Failed", got["exit3"]["status"]
    by_job: dict[str, list[dict]] = {}
    for p in pods:
        by_job.setdefault(p["metadata"].get("labels", {}).get("holmes.dev/job-name", ""), []).append(p)
    assert len(by_job["done"]) == 2 and len(by_job["exit3"]) == 1, sorted(by_job)
    for job, code in (("done", 0), ("exit3", 3)):
        for p in by_job[job]:
            assert p["spec"]["nodeName"] in HOLLOW, p["spec"]["nodeName"]
            (cs,) = p["status"]["containerStatuses"]
            assert cs["containerID"] == "hollow://app" and cs["state"]["terminated"]["exitCode"] == code, cs
    assert len({p["spec"]["nodeName"] for p in by_job["done"]}) == 2  # one pod per node
    (agent_pod,) = [p for p in pods if p["metadata"]["name"] == "on-agent"]
    assert agent_pod["spec"]["nodeName"] == "eth-0"
    done = wait_for(
        "the agent's pod to end",
        lambda: (lambda p: p if p["status"].get("phase") in ("Succeeded", "Failed") else None)(
            mixed.get("pod", "on-agent", "-n", ns)
        ),
        timeout=60,
    )
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert not done["status"]["containerStatuses"][0]["containerID"].startswith("hollow://")


def test_cluster_down_leaves_no_kwok_process(mixed):
    pid = mixed.cp.state()["pids"]["kwok"]
    down = mixed.localkube("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"stopping kwok (pid {pid})" in down.stdout
    assert not pid_alive(pid)
    assert mixed.kwok_processes() == []
    assert "kwok" not in mixed.cp.state().get("pids", {})
