"""Hollow nodes on kwok (hack/localkube/hollow.py with Holmes' Stages, kwok-stages.yaml) against
the test cluster: the nodes come Ready with Holmes' labels, resources and taint and their Leases
renewed by kwok; pods scheduled there by the real scheduler run and end as their annotations
say; churn through the API (a pod failed or finished, a node not ready) does what the benches
rely on. The nodes are unregistered at the end (the other cluster tests count the nodes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

NODES, ISLANDS = 2, 1


@pytest.fixture(scope="module")
def hollow(cluster):
    from kubernetes import client

    from localkube import hollow_nodes as hn

    cmd = [sys.executable, "-m", "localkube.hollow", f"--kubeconfig={cluster.kubeconfig}",
           f"--nodes={NODES}", f"--islands={ISLANDS}", "--start-seconds=0.2",
           "--lease-seconds=2"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "hack")}
    proc = subprocess.Popen(
        cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    names = [n.name for n in hn.hollow_nodes(NODES, ISLANDS)]
    core = client.CoreV1Api(cluster.api_client())
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and proc.poll() is None:
            if all(_ready(core, n) for n in names):
                break
            time.sleep(0.5)
        else:
            out = proc.communicate(timeout=10)[0] if proc.poll() is not None else ""
            raise AssertionError(f"hollow nodes not Ready in 60 s (rc {proc.poll()}):\n{out[-3000:]}")
        yield core, names
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=30)[0]
        subprocess.run(
            [*cmd, "--unregister"], env=env, cwd=REPO, check=False, capture_output=True, timeout=60
        )
        assert proc.returncode == 0, out[-3000:]


def _ready(core, name: str) -> bool:
    try:
        node = json.loads(core.read_node(name, _preload_content=False).data)
    except Exception:  # noqa: BLE001 (not registered yet)
        return False
    return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions") or [])


def _pod(name: str, node_label: str, **annotations: str) -> dict:
    from localkube import hollow_nodes as hn

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeSelector": {hn.HOLLOW: "true", "kubernetes.io/hostname": node_label},
            "tolerations": [{"key": hn.HOLLOW, "operator": "Exists"}],
            "initContainers": [{"name": "init", "image": "hollow"}],
            "containers": [{"name": "trainer", "image": "hollow", "command": ["sleep", "infinity"]}],
            "terminationGracePeriodSeconds": 30,
        },
    }


def apply_list(cluster, namespace: str, items: list[dict]) -> None:
    cluster.kubectl(
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        input=json.dumps({"kind": "List", "apiVersion": "v1", "items": items}),
    )


def _terminated(pod: dict) -> dict:
    return pod["status"]["containerStatuses"][0]["state"]["terminated"]


def test_hollow_nodes_are_kwoks_with_holmes_labels_resources_and_taint(cluster, hollow):
    from localkube import hollow_nodes as hn

    core, names = hollow
    for name in names:
        node = cluster.get_json("node", name)
        assert node["metadata"]["annotations"][hn.KWOK_NODE] == hn.KWOK_MANAGED
        assert node["metadata"]["labels"][hn.HOLLOW] == "true"
        assert node["metadata"]["labels"]["holmes.dev/cluster"] == "island-0"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert {"key": hn.HOLLOW, "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
        assert not [t for t in node["spec"]["taints"] if t["key"].startswith("node.kubernetes.io/")]
        lease = cluster.get_json("lease", name, "-n", "kube-node-lease")
        assert lease["spec"]["holderIdentity"], lease  # kwok holds it
    renewed = cluster.get_json("lease", names[0], "-n", "kube-node-lease")["spec"]["renewTime"]
    time.sleep(3)  # --lease-seconds=2: renewed at least once since
    assert cluster.get_json("lease", names[0], "-n", "kube-node-lease")["spec"]["renewTime"] != renewed


def test_pods_run_and_end_as_their_annotations_say(cluster, namespace, hollow):
    from localkube import hollow_nodes as hn

    _, names = hollow
    pods = {
        "exit7": _pod("exit7", names[0], **{hn.RUN_SECONDS: "1", hn.EXIT_CODE: "7"}),
        "bad": _pod("bad", names[0], **{hn.RUN_SECONDS: "soon"}),
        "endat": _pod("endat", names[1], **{hn.END_AT: str(int(time.time()) + 3)}),
        "ip": _pod("ip", names[1], **{hn.RUN_SECONDS: "0.5", hn.POD_IP: "127.0.0.1"}),
    }
    apply_list(cluster, namespace, list(pods.values()))
    got = {n: cluster.wait_pod(namespace, n, timeout=60) for n in pods}
    assert got["exit7"]["status"]["phase"] == "Failed" and _terminated(got["exit7"])["exitCode"] == 7
    assert '"error"' in _terminated(got["exit7"])["message"]
    assert got["bad"]["status"]["phase"] == "Failed" and _terminated(got["bad"])["exitCode"] == 2
    assert got["endat"]["status"]["phase"] == "Succeeded" and _terminated(got["endat"])["exitCode"] == 0
    ok = got["ip"]
    assert ok["status"]["phase"] == "Succeeded" and ok["status"]["podIP"] == "127.0.0.1"
    assert '"done"' in _terminated(ok)["message"]
    assert ok["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert "podIP" not in got["exit7"]["status"]  # hollow pods have no network unless told


def test_churn_through_the_api(cluster, namespace, hollow):
    from localkube import hollow as hl

    core, names = hollow
    pods = [_pod(n, names[i % 2]) for i, n in enumerate(("failme", "finishme", "dark"))]
    pods[2]["spec"]["nodeSelector"]["kubernetes.io/hostname"] = names[1]
    apply_list(cluster, namespace, pods)
    for p in ("failme", "finishme", "dark"):
        cluster.wait_pod(namespace, p, phases=("Running",), timeout=60)
    assert hl.fail_pod(core, namespace, "failme") and hl.finish_pod(core, namespace, "finishme")
    failed, done = cluster.wait_pod(namespace, "failme"), cluster.wait_pod(namespace, "finishme")
    assert failed["status"]["phase"] == "Failed" and _terminated(failed)["exitCode"] == 1
    assert done["status"]["phase"] == "Succeeded" and _terminated(done)["exitCode"] == 0
    assert not hl.fail_pod(core, namespace, "no-such-pod")

    # a node whose runtime is down: Ready=False, and its deleted pod stays until it is back
    assert hl.set_not_ready(core, names[1], True) >= 1
    end = time.monotonic() + 30
    while _ready(core, names[1]) and time.monotonic() < end:
        time.sleep(0.3)
    assert not _ready(core, names[1])
    cluster.kubectl("delete", "pod", "dark", "-n", namespace, "--wait=false")
    time.sleep(3)
    assert cluster.kubectl("get", "pod", "dark", "-n", namespace, check=False).returncode == 0
    hl.set_not_ready(core, names[1], False)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        gone = cluster.kubectl("get", "pod", "dark", "-n", namespace, check=False).returncode != 0
        if gone and _ready(core, names[1]):
            break
        time.sleep(0.3)
    else:
        raise AssertionError("the node did not come back Ready, or its deleted pod stayed")
