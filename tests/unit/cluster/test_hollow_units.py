"""Pure parts of the hollow nodes (hack/localkube/hollow_nodes.py): Holmes' own discovery reads
their NIC kind, island and GPU type the way it reads a real cluster's labels; the pod schedule
annotations; and the operator's request counter's naming (holmes.operator.api_count)."""

from __future__ import annotations

from collections import Counter

import pytest

from holmes.operator.api_count import classify
from holmes.plan import gpus
from holmes.plan.discovery import NicMapping, classify_node
from localkube import hollow_nodes as hn


def test_discovery_reads_every_island_as_the_labeller_and_nfd_publish_it():
    nodes = hn.hollow_nodes(50, 5)
    mapping = NicMapping(cluster_rdma_kinds=tuple(hn.rdma_kinds(5).items()))
    seen = Counter()
    for n in nodes:
        body = hn.node_body(n, "2026-01-01T00:00:00Z")
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


def pod(**ann):
    return {"metadata": {"annotations": {k: str(v) for k, v in ann.items()}}, "spec": {}}


def test_a_pods_schedule_comes_from_its_annotations():
    assert hn.schedule(pod(), None, 0) == hn.Schedule(None, 0)
    assert hn.schedule(pod(), 5.0, 0) == hn.Schedule(5.0, 0)
    assert hn.schedule(pod(**{hn.RUN_SECONDS: 3, hn.EXIT_CODE: 7}), None, 0) == hn.Schedule(3.0, 7)
    # an end time: whatever attempt the pod belongs to, at least a second of running
    assert hn.schedule(pod(**{hn.END_AT: 100}), None, 40) == hn.Schedule(60.0, 0)
    assert hn.schedule(pod(**{hn.END_AT: 100}), None, 400) == hn.Schedule(1.0, 0)
    # a value that is no number fails the pod, as a container that cannot start
    assert hn.schedule(pod(**{hn.RUN_SECONDS: "soon"}), None, 0) == hn.Schedule(0.0, 2)
    assert hn.schedule(pod(**{hn.RUN_SECONDS: -1}), None, 0) == hn.Schedule(0.0, 2)


def test_finished_pods_carry_the_trainers_last_line():
    p = {"spec": {"containers": [{"name": "trainer"}], "initContainers": [{"name": "init"}]}}
    ok = hn.finished_status(p, "t0", "t1", 0)
    assert ok["phase"] == "Succeeded" and "podIP" not in ok
    term = ok["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0 and '"holmes": "done"' in term["message"]
    assert ok["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    bad = hn.finished_status(p, "t0", "t1", 1, "127.0.0.1")
    assert bad["phase"] == "Failed" and bad["podIP"] == "127.0.0.1"


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
