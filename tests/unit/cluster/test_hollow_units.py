"""Pure parts of the hollow nodes (hack/localkube/hollow_nodes.py): Holmes' own discovery reads
their NIC kind, island and GPU type the way it reads a real cluster's labels; the kwok
configuration and Stages that play their kubelets; and the operator's request counter's naming
(holmes.operator.api_count)."""

from __future__ import annotations

from collections import Counter

import pytest
import yaml

from holmes.operator.api_count import classify
from holmes.plan import gpus
from holmes.plan.discovery import NicMapping, classify_node
from localkube import hollow_nodes as hn


def test_discovery_reads_every_island_as_the_labeller_and_nfd_publish_it():
    nodes = hn.hollow_nodes(50, 5)
    mapping = NicMapping(cluster_rdma_kinds=tuple(hn.rdma_kinds(5).items()))
    seen = Counter()
    for n in nodes:
        body = hn.node_body(n)
        nic = classify_node(body, mapping)
        assert (nic.nic, nic.cluster) == (n.nic, n.cluster), n.name
        assert nic.usable and nic.gpus == 8
        assert gpus.lookup(body["metadata"]["labels"]["nvidia.com/gpu.product"]) is not None
        assert {"key": hn.HOLLOW, "value": "true", "effect": "NoSchedule"} in body["spec"]["taints"]
        seen[(n.advertise, n.nic)] += 1
    assert set(seen) == {
        ("holmes", "infiniband"),
        ("holmes", "roce"),
        ("nfd", "infiniband"),
        ("nfd", "roce"),
        ("holmes", "ethernet"),
    }
    assert len({n.name for n in nodes}) == 50


def test_bad_sizes_name_the_argument():
    with pytest.raises(hn.HollowError, match="islands: 5 > nodes: 3"):
        hn.hollow_nodes(3, 5)
    with pytest.raises(hn.HollowError, match="nodes: 0"):
        hn.hollow_nodes(0, 1)


def test_nodes_are_registered_for_kwok_without_conditions():
    """kwok manages the nodes annotated for it; its Stages report Ready (none is claimed at
    registration), and no kubelet address is given."""
    body = hn.node_body(hn.hollow_nodes(1, 1)[0])
    assert body["metadata"]["annotations"][hn.KWOK_NODE] == hn.KWOK_MANAGED
    assert "conditions" not in body["status"]
    assert body["status"]["addresses"] == [{"type": "Hostname", "address": body["metadata"]["name"]}]
    assert body["status"]["capacity"]["nvidia.com/gpu"] == "8"


def stages(text: str) -> dict[str, dict]:
    docs = list(yaml.safe_load_all(text))
    assert docs[0]["kind"] == "KwokConfiguration"
    return {d["metadata"]["name"]: d for d in docs[1:]}


def test_kwok_config_carries_holmes_stages_with_the_flags_delays():
    got = stages(hn.kwok_config(start_seconds=2.5, status_seconds=60, parallelism=6))
    assert got["holmes-pod-running"]["spec"]["delay"] == {"durationMilliseconds": 2500}
    assert got["holmes-node-heartbeat"]["spec"]["delay"]["durationMilliseconds"] == 60000
    assert {d["kind"] for d in got.values()} == {"Stage"}
    assert {d["spec"]["resourceRef"]["kind"] for d in got.values()} == {"Node", "Pod"}
    # every annotation the Stages read is one hollow_nodes names
    text = hn.STAGES.read_text()
    for key in (hn.RUN_SECONDS, hn.END_AT, hn.EXIT_CODE, hn.POD_IP, hn.FAIL, hn.FINISH, hn.NOT_READY):
        assert key in text, key


def _requirements(stage: dict) -> dict[str, tuple[str, tuple]]:
    return {
        e["key"]: (e["operator"], tuple(e.get("values") or ()))
        for e in stage["spec"]["selector"]["matchExpressions"]
    }


def test_stages_of_a_kind_select_disjoint_objects():
    """kwok picks at random among the Stages that match an object: every two of a kind must
    differ on some key, one requiring what the other excludes."""
    got = list(stages(hn.kwok_config()).values())
    opposite = {("Exists", "DoesNotExist"), ("In", "NotIn")}
    for i, s in enumerate(got):
        for t in got[i + 1 :]:
            if s["spec"]["resourceRef"] != t["spec"]["resourceRef"]:
                continue
            rs, rt = _requirements(s), _requirements(t)
            disjoint = any(
                (rs[k][0], rt[k][0]) in opposite | {(b, a) for a, b in opposite}
                and rs[k][1] == rt[k][1]
                or rs[k][0] == rt[k][0] == "In"
                and not set(rs[k][1]) & set(rt[k][1])
                for k in set(rs) & set(rt)
            )
            assert disjoint, (s["metadata"]["name"], t["metadata"]["name"])


def test_bad_kwok_settings_name_the_setting():
    with pytest.raises(hn.HollowError, match="status seconds 0"):
        hn.kwok_config(status_seconds=0)
    with pytest.raises(hn.HollowError, match="parallelism: 0"):
        hn.kwok_config(parallelism=0)


@pytest.mark.parametrize(
    "method,url,query,want",
    [
        ("GET", "https://h/api/v1/namespaces/a/pods", [("watch", True)], ("WATCH", "pods")),
        ("GET", "https://h/api/v1/pods?watch=true", None, ("WATCH", "pods")),
        ("GET", "https://h/api/v1/namespaces/a/pods", [("labelSelector", "x")], ("LIST", "pods")),
        ("GET", "https://h/api/v1/namespaces/a/pods/p/log", None, ("GET", "pods/log")),
        ("PATCH", "https://h/apis/holmes.dev/v1alpha1/namespaces/a/holmesjobs/j/status", None,
         ("PATCH", "holmesjobs/status")),
        ("GET", "https://h/api/v1/nodes/n", None, ("GET", "nodes")),
        ("GET", "https://h/apis/holmes.dev/v1alpha1", None, ("GET", "other")),
    ],
)  # fmt: skip
def test_the_operators_requests_are_named_as_the_api_server_names_them(method, url, query, want):
    assert classify(method, url, query) == want


def test_the_bench_topology_is_the_hollow_nodes_played_by_kwok():
    """bench/operator_scale.py's cluster: hollow_nodes as a topology file, read back unchanged."""
    from localkube.topology import KWOK, KwokSettings, parse_topology

    nodes = hn.hollow_nodes(10, 5)
    doc = yaml.safe_load(yaml.safe_dump(hn.topology_doc(nodes, leaseSeconds=2.5)))
    topo = parse_topology(doc)
    assert topo.nodes == tuple(nodes) and {n.played_by for n in topo.nodes} == {KWOK}
    assert topo.kwok == KwokSettings(lease_seconds=2.5)
    assert [hn.node_body(n) for n in topo.nodes] == [hn.node_body(n) for n in nodes]
    assert "kwok" not in hn.topology_doc(nodes)
