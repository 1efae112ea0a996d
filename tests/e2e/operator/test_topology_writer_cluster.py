"""One topology-label writer per installation (issue 51): an operator replica that does not hold
the leader Lease writes no node labels, however its nodes change; once it leads it writes every
node's labels (it goes over them all once). On the real API server, the operator a subprocess
with --leader-elect, the Lease held by another replica (the test) until the test lets it go.
The writer's wiring without a cluster: tests/unit/operator/test_island_topology.py."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from kubernetes import client

from holmes.operator.core import island_topology as topology
from tests.helpers.operator.cluster_helpers import running_operator, wait_for

pytestmark = pytest.mark.timeout(300)

NODE = "eth-0"
LEASE = "holmes-writer-test"
KEYS = (topology.LABEL_CLUSTER, topology.LABEL_ISLAND)


def labels_of(cluster, node: str) -> dict[str, str]:
    return cluster.get_json("node", node)["metadata"].get("labels") or {}


@pytest.fixture
def unlabelled(crd):
    """NODE without Holmes' topology labels; put back as they were afterwards."""
    before = {k: v for k, v in labels_of(crd, NODE).items() if k in KEYS}
    crd.kubectl("label", "node", NODE, *(f"{k}-" for k in KEYS), check=False)
    yield before
    crd.kubectl("label", "node", NODE, "holmes-test/touched-", check=False)
    if before:
        crd.kubectl("label", "node", NODE, "--overwrite", *(f"{k}={v}" for k, v in before.items()))


@pytest.fixture
def held_lease(crd, namespace):
    """The Lease, held by another replica that will not give it up by itself (an hour's lease)."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    body = {
        "metadata": {"name": LEASE, "namespace": namespace},
        "spec": {"holderIdentity": "another-replica", "leaseDurationSeconds": 3600, "renewTime": now},
    }
    coord = client.CoordinationV1Api(crd.api_client())
    coord.create_namespaced_lease(namespace, body)
    return coord


def test_a_follower_writes_no_labels_and_writes_them_all_once_it_leads(
    crd, namespace, tmp_path, unlabelled, held_lease
):
    extra = [
        "--leader-elect",
        f"--leader-elect-namespace={namespace}",
        f"--leader-elect-name={LEASE}",
        "--leader-elect-retry-period=0.5",
        "--leader-elect-renew-deadline=2",
        "--leader-elect-lease-duration=3",
    ]
    gen = running_operator(crd, namespace, tmp_path, extra=extra)
    op = next(gen)
    try:
        # its node informer lists the node (and sees it change) while another replica leads
        time.sleep(3)
        crd.kubectl("label", "node", NODE, "holmes-test/touched=1", "--overwrite")
        time.sleep(5)
        assert "holmes_leader 0.0" in op.metrics()
        assert not set(KEYS) & set(labels_of(crd, NODE)), f"a follower wrote labels\n{op.tail()}"
        # the other replica lets go: this one leads and labels the node it was offered before
        held_lease.delete_namespaced_lease(LEASE, namespace)
        got = wait_for(
            "the leader's labels",
            lambda: (lambda ls: ls if set(KEYS) <= set(ls) else None)(labels_of(crd, NODE)),
            timeout=30,
            op=op,
        )
        assert "holmes_leader 1.0" in op.metrics()
        assert got[topology.LABEL_CLUSTER] == "east" and got[topology.LABEL_ISLAND].startswith(
            "east.ethernet"
        )
        if unlabelled:
            assert {k: got[k] for k in KEYS} == unlabelled
    finally:
        next(gen, None)  # stops the operator
