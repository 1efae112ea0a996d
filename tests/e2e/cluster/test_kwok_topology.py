"""A mixed topology (hack/topologies/mixed.yaml): two nodes played by the node agent and four
hollow nodes played by kwok (``playedBy: kwok``), started and stopped as ``make cluster-up
TOPOLOGY=...`` and ``make cluster-down`` do (``python -m localkube up|down``). The kwok nodes come
Ready with the topology's labels, annotations, taints and resources, one kwok process plays them
all; a HolmesJob's pods land on them and end as their ``hollow.holmes.dev/*`` annotations say,
while a pod on an agent node runs as a process; ``down`` leaves no kwok process.

Churn through the API does what the benches rely on (hollow.py: a pod failed or finished, a node
not ready and back). Its own cluster (not the session's ``cluster``: another topology)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
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


@pytest.fixture
def ns(mixed):
    name = f"t-{uuid.uuid4().hex[:8]}"
    mixed.kubectl("create", "namespace", name)
    wait_for(
        "the default service account",
        lambda: mixed.kubectl("get", "sa", "default", "-n", name, check=False).returncode == 0,
    )
    yield name
    mixed.kubectl("delete", "namespace", name, "--wait=false", check=False)


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
    renewed = mixed.get("lease", HOLLOW[0], "-n", "kube-node-lease")["spec"]["renewTime"]
    time.sleep(3)  # leaseSeconds: 2: renewed at least once since
    assert mixed.get("lease", HOLLOW[0], "-n", "kube-node-lease")["spec"]["renewTime"] != renewed
    st = mixed.cp.state()
    assert st["kwok"]["nodes"] == len(HOLLOW) and st["kwok"]["readyS"] > 0
    assert mixed.kwok_processes() == [st["pids"]["kwok"]]
    assert mixed.cp.running()
    nodes_out = mixed.localkube("nodes")
    assert nodes_out.returncode == 0 and "kwok-3" in nodes_out.stdout, nodes_out.stderr


def _pod(name: str, node: str, **annotations: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeSelector": {"pool": "hollow", "kubernetes.io/hostname": node},
            "tolerations": [{"key": "pool", "operator": "Exists"}],
            "initContainers": [{"name": "init", "image": "hollow"}],
            "containers": [{"name": "trainer", "image": "hollow", "command": ["sleep", "infinity"]}],
            "terminationGracePeriodSeconds": 30,
        },
    }


def _wait_pod(c: Mixed, ns: str, name: str, phases=("Succeeded", "Failed"), timeout: float = 60) -> dict:
    def phase():
        r = c.kubectl("get", "pod", name, "-n", ns, "-o", "json", check=False)
        p = json.loads(r.stdout) if r.returncode == 0 else {}
        return p if p.get("status", {}).get("phase") in phases else None

    return wait_for(f"pod {ns}/{name} in {phases}", phase, timeout=timeout)


def _terminated(pod: dict) -> dict:
    return pod["status"]["containerStatuses"][0]["state"]["terminated"]


def _ready(c: Mixed, node: str) -> bool:
    conds = c.get("node", node)["status"].get("conditions") or []
    return any(x["type"] == "Ready" and x["status"] == "True" for x in conds)


def test_pods_run_and_end_as_their_annotations_say(mixed, ns):
    pods = {
        "exit7": _pod("exit7", HOLLOW[0], **{hn.RUN_SECONDS: "1", hn.EXIT_CODE: "7"}),
        "bad": _pod("bad", HOLLOW[0], **{hn.RUN_SECONDS: "soon"}),
        "endat": _pod("endat", HOLLOW[1], **{hn.END_AT: str(int(time.time()) + 3)}),
        "ip": _pod("ip", HOLLOW[1], **{hn.RUN_SECONDS: "0.5", hn.POD_IP: "127.0.0.1"}),
    }
    mixed.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(pods.values()))
    got = {n: _wait_pod(mixed, ns, n) for n in pods}
    assert got["exit7"]["status"]["phase"] == "Failed" and _terminated(got["exit7"])["exitCode"] == 7
    assert '"error"' in _terminated(got["exit7"])["message"]
    assert got["bad"]["status"]["phase"] == "Failed" and _terminated(got["bad"])["exitCode"] == 2
    assert got["endat"]["status"]["phase"] == "Succeeded" and _terminated(got["endat"])["exitCode"] == 0
    ok = got["ip"]
    assert ok["status"]["phase"] == "Succeeded" and ok["status"]["podIP"] == "127.0.0.1"
    assert '"done"' in _terminated(ok)["message"]
    assert ok["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert "podIP" not in got["exit7"]["status"]  # hollow pods have no network unless told


def test_churn_through_the_api(mixed, ns):
    from kubernetes import client

    from localkube import hollow as hl

    core = client.CoreV1Api(hl.api_client(mixed.kubeconfig))
    pods = [_pod("failme", HOLLOW[0]), _pod("finishme", HOLLOW[1]), _pod("dark", HOLLOW[1])]
    mixed.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(pods))
    for p in ("failme", "finishme", "dark"):
        _wait_pod(mixed, ns, p, phases=("Running",))
    assert hl.fail_pod(core, ns, "failme") and hl.finish_pod(core, ns, "finishme")
    failed, done = _wait_pod(mixed, ns, "failme"), _wait_pod(mixed, ns, "finishme")
    assert failed["status"]["phase"] == "Failed" and _terminated(failed)["exitCode"] == 1
    assert done["status"]["phase"] == "Succeeded" and _terminated(done)["exitCode"] == 0
    assert not hl.fail_pod(core, ns, "no-such-pod")

    # a node whose runtime is down: Ready=False, and its deleted pod stays until it is back
    assert hl.set_not_ready(core, HOLLOW[1], True) >= 1
    wait_for(f"{HOLLOW[1]} NotReady", lambda: not _ready(mixed, HOLLOW[1]), timeout=30)
    mixed.kubectl("delete", "pod", "dark", "-n", ns, "--wait=false")
    time.sleep(3)
    assert mixed.kubectl("get", "pod", "dark", "-n", ns, check=False).returncode == 0
    hl.set_not_ready(core, HOLLOW[1], False)
    wait_for(
        "the node Ready again and its deleted pod gone",
        lambda: (
            _ready(mixed, HOLLOW[1]) and mixed.kubectl("get", "pod", "dark", "-n", ns, check=False).returncode
        ),
        timeout=30,
    )


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


def test_a_holmesjobs_pods_land_on_kwok_nodes_and_end_as_annotated(mixed, ns, tmp_path):
    install_crd(mixed.kubeconfig)
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
