"""The labeller against the local control plane.

1. The chart's DaemonSet (its labeller templates, applied as rendered): the node agent runs one
   labeller pod per simulated node, each reading its own fake sysfs tree (a hostPath holding one
   tree per node, ``--sysfs-root /host/sys/$(NODE_NAME)``) with the chart's RBAC. The NFD-only
   nodes ib-1 and roce-1 become classifiable without any ``--cluster-rdma-kind``; the admin labels
   of ib-0/roce-0 stay as they were; the host route table the chart mounts moves roce-1's socket
   interface off its RoCE rail's netdev; a port going down is followed. Every node's labels and
   annotations are restored exactly afterwards (the session's other tests share these nodes).
2. ``python -m holmes.labeller --once`` on a kwok-played node of its own: compute rails that
   disagree (annotation + Warning Event), then the admin's rail selector annotation answering it,
   and the exit codes for a missing node and a service account without rights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from holmes.labeller.labels import RECORD_ANNOTATION
from holmes.plan import classify_node
from localkube.operatorproc import api_node as api_node_body
from tests.helpers import polling
from tests.helpers.labeller.fakesysfs import FakeSysfs, gpu_server, node_tree, roce_node, route_table
from tests.helpers.operator.cluster_helpers import register_hollow
from tests.helpers.packaging.chart_release import built_repositories
from tests.helpers.packaging.packaging_helpers import CHART, helm  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
TRUE_NIC = "localkube.holmes.dev/true-nic"
NFD = {"feature.node.kubernetes.io/rdma.capable": "true", "feature.node.kubernetes.io/rdma.available": "true"}


def wait_for(what: str, fn, timeout: float = 40.0, every: float = 0.5):
    return polling.wait_for(what, fn, timeout, every)


def node_meta(cluster, name: str) -> dict:
    return cluster.get_json("node", name)["metadata"]


def restore(cluster, name: str, snap: dict) -> None:
    """Put a node's labels and annotations back to exactly ``snap``."""
    meta = node_meta(cluster, name)
    patch = {}
    for part in ("labels", "annotations"):
        cur, old = meta.get(part) or {}, snap.get(part) or {}
        diff = {k: None for k in cur if k not in old}
        diff.update({k: v for k, v in old.items() if cur.get(k) != v})
        if diff:
            patch[part] = diff
    if patch:
        cluster.kubectl("patch", "node", name, "--type=merge", "-p", json.dumps({"metadata": patch}))


@pytest.fixture
def sysfs_trees(tmp_path, cluster):
    """One fake sysfs per simulated node, under one folder (the DaemonSet's hostPath)."""
    root = tmp_path / "sysfs"
    for n in cluster.topology.nodes:
        node_tree(root / n.name, n.nic, n.gbps)
    return root


def test_daemonset_labels_nfd_only_nodes_from_their_sysfs(cluster, namespace, sysfs_trees):
    names = cluster.topology.names
    snaps = {
        n: {k: dict(v) for k, v in node_meta(cluster, n).items() if k in ("labels", "annotations")}
        for n in names
    }
    nfd_only = [n for n in cluster.topology.nodes if n.advertise == "nfd"]
    assert {n.nic for n in nfd_only} == {"infiniband", "roce"}, "the default topology changed"
    for n in nfd_only:  # the problem this solves: without a kind flag these nodes are unusable
        assert not classify_node(cluster.get_json("node", n.name)).usable

    release = f"lbl-{namespace}"
    # its own namespace, which the chart creates privileged (the release's stays restricted)
    lns = f"{namespace}-nic"
    values = sysfs_trees.parent / "values.yaml"
    routes = sysfs_trees.parent / "route"  # every simulated host's default route: eno1
    routes.write_text(route_table("eno1"))
    # a real node runs only images in its containerd: the built operator image, not the chart's
    # default name (a host process of the node agent)
    image = {"image": {"repository": built_repositories()[0]}} if cluster.real_nodes else {}
    values.write_text(
        yaml.safe_dump(
            {
                **image,
                "labeller": {
                    "enabled": True,
                    "namespace": {"name": lns},
                    "intervalSeconds": 1,
                    "sysfs": {"hostPath": str(sysfs_trees), "root": "/host/sys/$(NODE_NAME)"},
                    "defaultRoute": {"hostPath": str(routes)},
                    # only the topology's nodes: a hollow node (kwok) runs no process, so a
                    # labeller pod there would read no sysfs
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "kubernetes.io/hostname",
                                                "operator": "In",
                                                "values": names,
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                },
            }
        )
    )
    manifest = helm(
        "template",
        release,
        str(CHART),
        "-n",
        namespace,
        "--show-only",
        "templates/labeller.yaml",
        "--show-only",
        "templates/labeller-admission.yaml",  # the API server enforces it (1.30+)
        "-f",
        str(values),
    ).stdout
    assert "kind: ValidatingAdmissionPolicy" in manifest
    selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=nic-labeller"
    try:
        cluster.kubectl("apply", "-f", "-", input=manifest)

        def labelled():
            nodes = {n: cluster.get_json("node", n) for n in names}
            done = all(RECORD_ANNOTATION in nodes[n]["metadata"].get("annotations", {}) for n in names)
            return nodes if done else None

        nodes = wait_for("every node to carry the labeller's record", labelled)

        ns_labels = cluster.get_json("namespace", lns)["metadata"]["labels"]
        assert ns_labels["pod-security.kubernetes.io/enforce"] == "privileged"
        assert not cluster.get_json("pods", "-n", namespace, "-l", selector)["items"]
        sa = f"system:serviceaccount:{lns}:{release}-holmes-labeller"
        for verb, args, allowed in (
            ("patch", ["nodes"], "yes"),
            ("get", ["nodes"], "yes"),
            ("list", ["nodes"], "no"),
            ("create", ["events", "-n", "default"], "yes"),
            ("create", ["events", "-n", lns], "no"),
            ("get", ["secrets", "-n", lns], "no"),
        ):
            r = cluster.kubectl("auth", "can-i", verb, *args, f"--as={sa}", check=False)
            assert r.stdout.strip() == allowed, (verb, args, r.stdout, r.stderr)
        pods = cluster.get_json("pods", "-n", lns, "-l", selector)["items"]
        assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(names), "one labeller pod per node"
        refused_outside_its_node(cluster, lns, f"{release}-holmes-labeller", pods[0], names)
        for n in cluster.topology.nodes:
            got = classify_node(nodes[n.name])  # default NicMapping: no kind flags
            assert got.usable and got.nic == nodes[n.name]["metadata"]["annotations"][TRUE_NIC], (n.name, got)
            assert got.gbps == n.gbps, (n.name, got.gbps)
        for n in nfd_only:
            meta = nodes[n.name]["metadata"]
            assert (
                meta["labels"]["holmes.dev/nic"] == n.nic
                and classify_node(nodes[n.name]).source == "holmes-labels"
            )
            assert meta["annotations"]["holmes.dev/nic-hcas"] == "mlx5_0"
            assert classify_node(nodes[n.name]).hcas == ("mlx5_0",)
        # Admin-set keys (the "holmes" advertise scheme) are untouched and not claimed.
        for n in (n for n in cluster.topology.nodes if n.advertise == "holmes"):
            meta = nodes[n.name]["metadata"]
            for key in ("holmes.dev/nic", "holmes.dev/nic-gbps"):
                assert meta["labels"][key] == snaps[n.name]["labels"][key]
            assert "holmes.dev/nic" not in json.loads(meta["annotations"][RECORD_ANNOTATION])["labels"]
        # roce-1's fastest Ethernet netdev is its RoCE rail's: the default route's eno1 instead.
        roce1 = next(n.name for n in nfd_only if n.nic == "roce")
        assert nodes[roce1]["metadata"]["annotations"]["holmes.dev/socket-ifname"] == "eno1"
        # The truth changes: roce-1's RoCE port goes down -> sockets only, its RDMA keys removed.
        FakeSysfs(sysfs_trees / roce1).set_port_state("mlx5_0", 1, "1: DOWN")

        def downgraded():
            meta = node_meta(cluster, roce1)
            ok = (
                meta["labels"].get("holmes.dev/nic") == "ethernet"
                and "holmes.dev/nic-hcas" not in meta["annotations"]
            )
            return meta if ok else None

        meta = wait_for(f"{roce1} to be labelled ethernet", downgraded, timeout=20)
        assert "holmes.dev/link-layer" not in meta["labels"]
        assert meta["annotations"]["holmes.dev/socket-ifname"] == "ens1f0np0"  # no longer a rail's
        assert (
            meta["annotations"]["holmes.dev/nic-other"] == "mlx5_0/1 (Ethernet, 100 Gb/s): not ACTIVE (DOWN)"
        )
        log = cluster.pod_log(
            lns, next(p["metadata"]["name"] for p in pods if p["spec"]["nodeName"] == roce1), "labeller"
        )
        assert f"{roce1}: roce: 1 ACTIVE port(s) on mlx5_0, 100 Gbit/s" in log, log[-2000:]
        assert "ports not ACTIVE, ignored: mlx5_0/1 (DOWN)" in log
    finally:
        cluster.kubectl("delete", "daemonset", "-n", lns, "-l", selector, "--wait=true", check=False)
        wait_for(
            "the labeller pods to be gone",
            lambda: not cluster.get_json("pods", "-n", lns, "-l", selector)["items"],
            timeout=30,
        )
        cluster.kubectl("delete", "namespace", lns, "--wait=false", check=False)
        cluster.kubectl(
            "delete",
            "clusterrole,clusterrolebinding,validatingadmissionpolicy,validatingadmissionpolicybinding",
            "-l",
            selector,
            check=False,
        )
        cluster.kubectl("delete", "role,rolebinding", "-n", "default", "-l", selector, check=False)
        for n in names:
            restore(cluster, n, snaps[n])
    for n in names:
        meta = node_meta(cluster, n)
        assert (meta.get("labels") or {}) == snaps[n]["labels"] and (meta.get("annotations") or {}) == snaps[
            n
        ]["annotations"]


def labeller(cluster, *args: str, kubeconfig: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "holmes.labeller",
            "--once",
            "--kubeconfig",
            kubeconfig or cluster.kubeconfig,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


@pytest.fixture
def api_node(cluster):
    """A Node of this test's own, played by the cluster's kwok (heartbeated, Ready, running no
    process): NFD labels, an admin's gbps. Tainted so that no other test's pod lands there."""
    name = f"lbl-{uuid.uuid4().hex[:6]}"
    labels = {**NFD, "holmes.dev/nic-gbps": "800", "team": "a"}
    taint = {"key": "holmes.dev/labeller-test", "value": "true", "effect": "NoSchedule"}
    register_hollow(
        cluster, [api_node_body(name, labels, {"cpu": "8", "memory": "32Gi", "pods": "10"}, taint)]
    )
    yield name
    cluster.kubectl("delete", "node", name, "--wait=false", check=False)
    cluster.kubectl(
        "delete", "events", "-n", "default", "--field-selector", f"involvedObject.name={name}", check=False
    )


def test_once_rails_that_disagree_then_the_admin_selector_and_clear_failures(
    cluster, namespace, api_node, tmp_path
):
    mixed = tmp_path / "mixed"  # 4 InfiniBand + 4 RoCE rails, each near a GPU
    gpu_server(mixed, rail_links=("InfiniBand",) * 4 + ("Ethernet",) * 4)
    r = labeller(cluster, "--node-name", api_node, "--sysfs-root", str(mixed), "--route-table", "")
    assert r.returncode == 0, r.stderr
    assert "problem: the compute rails disagree" in r.stderr
    node = cluster.get_json("node", api_node)
    ann = node["metadata"]["annotations"]
    assert (
        "InfiniBand on mlx5_0/1, mlx5_1/1, mlx5_2/1, mlx5_3/1; Ethernet on mlx5_4/1"
        in ann["holmes.dev/nic-problem"]
    )
    assert "holmes.dev/nic-rails=mlx5_0,mlx5_1,mlx5_2,mlx5_3" in ann["holmes.dev/nic-problem"]
    assert "holmes.dev/nic" not in node["metadata"]["labels"]
    assert any("the compute rails disagree" in p for p in classify_node(node).problems)
    events = wait_for(
        "the NicProblem event",
        lambda: [
            e
            for e in cluster.get_json(
                "events", "-n", "default", "--field-selector", f"involvedObject.name={api_node}"
            )["items"]
            if e["reason"] == "NicProblem"
        ],
        timeout=30,
    )
    assert events[0]["type"] == "Warning" and events[0]["involvedObject"]["kind"] == "Node"

    # The admin does what the problem says; the node annotation wins over --rails.
    cluster.kubectl("annotate", "node", api_node, "holmes.dev/nic-rails=mlx5_[0-3]")
    r = labeller(cluster, "--node-name", api_node, "--sysfs-root", str(mixed), "--rails", "mlx5_7")
    assert r.returncode == 0, r.stderr
    meta = node_meta(cluster, api_node)
    assert "holmes.dev/nic-problem" not in meta["annotations"]
    assert meta["labels"]["holmes.dev/nic"] == "infiniband"
    assert meta["annotations"]["holmes.dev/nic-hcas"] == "mlx5_0,mlx5_1,mlx5_2,mlx5_3"
    assert (
        "not named by node annotation holmes.dev/nic-rails 'mlx5_[0-3]'"
        in meta["annotations"]["holmes.dev/nic-other"]
    )
    cluster.kubectl("annotate", "node", api_node, "holmes.dev/nic-rails-")

    roce_node(tmp_path / "roce", 200)
    r = labeller(cluster, "--node-name", api_node, "--sysfs-root", str(tmp_path / "roce"))
    assert r.returncode == 0, r.stderr
    assert "holmes.dev/nic-gbps='800' set by someone else: left alone" in r.stderr
    meta = node_meta(cluster, api_node)
    assert "holmes.dev/nic-problem" not in meta["annotations"]
    assert (
        meta["labels"]["holmes.dev/nic"],
        meta["labels"]["holmes.dev/nic-gbps"],
        meta["labels"]["team"],
    ) == ("roce", "800", "a")
    n = classify_node(cluster.get_json("node", api_node))
    assert n.usable and (n.nic, n.gbps, n.hcas) == ("roce", 800.0, ("mlx5_0",))
    again = labeller(cluster, "--node-name", api_node, "--sysfs-root", str(tmp_path / "roce"))
    assert again.returncode == 0 and "labels up to date" in again.stderr

    r = labeller(cluster, "--node-name", "no-such-node", "--sysfs-root", str(tmp_path / "roce"))
    assert r.returncode == 1 and "node 'no-such-node': not found (404)" in r.stderr, r.stderr
    r = labeller(cluster, "--node-name", api_node, "--sysfs-root", str(tmp_path / "nothing"))
    assert r.returncode == 1 and "is not a sysfs tree" in r.stderr, r.stderr

    # The namespace's default service account has no rights on nodes.
    token = cluster.kubectl("create", "token", "default", "-n", namespace).stdout.strip()
    cfg = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    cfg["users"] = [{"name": "nobody", "user": {"token": token}}]
    for ctx in cfg["contexts"]:
        ctx["context"]["user"] = "nobody"
    kc = tmp_path / "nobody.kubeconfig"
    kc.write_text(yaml.safe_dump(cfg))
    os.chmod(kc, 0o600)
    r = labeller(cluster, "--node-name", api_node, "--sysfs-root", str(tmp_path / "roce"), kubeconfig=str(kc))
    assert (
        r.returncode == 1 and "forbidden (403): the service account needs nodes get and patch" in r.stderr
    ), r.stderr


def refused_outside_its_node(cluster, namespace: str, sa: str, pod: dict, names: list[str]) -> None:
    """The chart's ValidatingAdmissionPolicy, run by the API server: a token bound to a labeller
    pod (as the kubelet requests it; the server adds the pod's node to its user extra) may change
    holmes.dev/ keys of that pod's node only."""
    token = cluster.kubectl(
        "create",
        "token",
        sa,
        "-n",
        namespace,
        "--bound-object-kind=Pod",
        f"--bound-object-name={pod['metadata']['name']}",
        f"--bound-object-uid={pod['metadata']['uid']}",
    ).stdout.strip()
    own = pod["spec"]["nodeName"]
    other = next(n for n in names if n != own)

    def label(node: str, key: str) -> subprocess.CompletedProcess:
        return cluster.kubectl(
            f"--token={token}", "label", "node", node, f"{key}=vap-test", "--overwrite", check=False
        )

    r = label(other, "holmes.dev/vap-test")
    assert r.returncode != 0 and "may write only the Node its pod runs on" in r.stderr, r.stderr
    r = label(own, "example.com/vap-test")
    assert r.returncode != 0 and "may change only holmes.dev/ labels" in r.stderr, r.stderr
    label(own, "holmes.dev/vap-test").check_returncode()
    cluster.kubectl("label", "node", own, "holmes.dev/vap-test-")
