"""Fixtures of the framework tests."""

import pytest

from tests.helpers.frameworks.cluster_jobs import LINK_LAYER


@pytest.fixture(scope="module")
def one_site(cluster):
    """All nodes in one site (clusterLabel kubernetes.io/os: every node is linux), so an island is
    a NIC kind; the NFD-advertised nodes then need their link layer as the labeller would publish
    it (the operator's per-cluster --cluster-rdma-kind cannot tell InfiniBand from RoCE in one
    site). The labels are removed after the module (a module-scoped job may need them)."""
    link = {n.name: LINK_LAYER[n.nic] for n in cluster.topology.nodes if n.nic in LINK_LAYER}
    for node, layer in link.items():
        cluster.kubectl("label", "node", node, f"holmes.dev/link-layer={layer}", "--overwrite")
    yield cluster
    for node in link:
        cluster.kubectl("label", "node", node, "holmes.dev/link-layer-", check=False)
