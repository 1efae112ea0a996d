"""What a Socket group reaches with the TCP flows its pods get, and vendor net plugins as an
explicit per-island choice (issue 34, defect 6)."""

from __future__ import annotations

import pytest

from holmes.contract import Layout
from holmes.plan import plan
from holmes.plan.discovery import NodeNic
from holmes.plan.nccl import SOCKET_MAX_FLOWS, SOCKET_MAX_THREADS, socket_threads
from holmes.plan.topology import Fabric, NodeSet, group_bandwidth_gbps, summarize
from tests.helpers.plan.plan_helpers import node


@pytest.mark.parametrize("gbps", [1, 6.25, 10, 25, 50, 100, 200, 400, 800, 3200])
def test_socket_threads_fill_the_link_within_nccls_limits(gbps):
    """NCCL (src/transport/net_socket.cc): at most 16 helper threads (MAX_THREADS) and 64
    sockets (MAX_SOCKETS) per connection; more is cut down with a warning."""
    threads, socks = socket_threads(gbps, 6.25)
    assert 1 <= threads <= SOCKET_MAX_THREADS and 1 <= socks and threads * socks <= SOCKET_MAX_FLOWS
    assert threads * socks * 6.25 >= gbps or threads * socks == SOCKET_MAX_FLOWS
    assert (threads - 1) * socks * 6.25 < gbps  # no thread more than the link needs


def test_nccl_docs_choice_for_a_generic_100g_network():
    assert socket_threads(100, 6.25) == (4, 4)
    with pytest.raises(ValueError, match="must be > 0"):
        socket_threads(0, 6.25)


def ethernet(name: str, gbps: float, **fields) -> NodeNic:
    return NodeNic(name=name, cluster="lab", nic="ethernet", gbps=gbps, gpus=8, **fields)


def test_a_socket_group_reaches_its_flows_times_one_flows_rate():
    fabric = Fabric()
    pair = [ethernet("a", 100), ethernet("b", 100)]
    assert group_bandwidth_gbps(summarize(pair, fabric), fabric) == pytest.approx(60.0)  # 16 flows: the link
    one_flow = [ethernet(n, 100, socket_fixed=(1, 1)) for n in "ab"]  # NCCL's default
    assert group_bandwidth_gbps(summarize(one_flow, fabric), fabric) == pytest.approx(fabric.socket_flow_gbps)
    capped = [ethernet(n, 100, socket_fixed=(32, 4)) for n in "ab"]  # NCCL cuts 32 threads to 16
    assert group_bandwidth_gbps(summarize(capped, fabric), fabric) == pytest.approx(60.0)
    assert NodeSet(1, frozenset({"ethernet"}), frozenset({"x"}), 1.0, 1.0).socket_flows_gbps == float("inf")


def eth_job(env: list[dict] | None = None, **spec) -> dict:
    container: dict = {"name": "trainer", **({"env": env} if env else {})}
    return {
        "apiVersion": "holmes.dev/v1alpha1",
        "kind": "HolmesJob",
        "metadata": {"name": "eth"},
        "spec": {
            "model": {
                "layers": 8,
                "hiddenSize": 2048,
                "attentionHeads": 16,
                "seqLength": 1024,
                "vocabSize": 32000,
            },
            "training": {
                "globalBatchSize": 64,
                "microBatchSize": 2,
                "iterations": 10,
                "learningRate": 1.0e-4,
            },
            "nodes": {"count": 4, "gpusPerNode": 8},
            "parallelism": {"pipeline": 1},
            "template": {"spec": {"containers": [container]}},
            **spec,
        },
    }


def eth_nodes(gbps: int = 100) -> list[dict]:
    return [node(f"e{i}", "ethernet", "lab", gbps=gbps) for i in range(4)]


def test_the_plan_prices_the_flows_the_pods_run():
    """The template's NCCL_SOCKET_NTHREADS/NCCL_NSOCKS_PERTHREAD win over Holmes' in the pod, so
    they are what the cost model prices: one flow (NCCL's default) makes the DP groups slow."""
    holmes = plan(eth_nodes(), eth_job())
    one = [{"name": "NCCL_SOCKET_NTHREADS", "value": "1"}, {"name": "NCCL_NSOCKS_PERTHREAD", "value": "1"}]
    single = plan(eth_nodes(), eth_job(one))
    assert holmes.stages[0].dp_net == single.stages[0].dp_net == "Socket"
    assert single.estimate["iterationSeconds"] > 1.5 * holmes.estimate["iterationSeconds"]


def test_a_vendor_net_plugin_is_an_explicit_per_island_choice():
    """EFA/TCPX nodes look like Ethernet to discovery; Socket there would override the plugin.
    With spec.islands[].netPlugin the island's groups carry the plugin's net name."""
    islands = [{"cluster": "lab", "nic": "ethernet", "netPlugin": "AWS Libfabric"}]
    layout = plan(eth_nodes(), eth_job(islands=islands))
    assert {g.net for g in layout.groups if g.kind == "dp"} == {"AWS Libfabric"}
    assert layout.world_net == "AWS Libfabric"
    assert Layout.from_json(layout.to_json()) == layout  # the contract carries it
    # across islands the plugin does not reach: sockets
    mixed = eth_nodes() + [node(f"w{i}", "ethernet", "other", gbps=100) for i in range(4)]
    job = eth_job(islands=islands)
    job["spec"]["nodes"] = {"count": 8, "gpusPerNode": 8}
    job["spec"]["parallelism"] = {"pipeline": 2}
    job["spec"]["training"]["globalBatchSize"] = 256
    across = plan(mixed, job)
    nets = {s.island: s.dp_net for s in across.stages}
    assert nets == {"lab/ethernet": "AWS Libfabric", "other/ethernet": "Socket"}
    assert {g.net for g in across.groups if g.kind == "p2p"} == {"Socket"}
    without = plan(mixed, {**job, "spec": {**job["spec"], "islands": []}})
    assert {s.dp_net for s in without.stages} == {"Socket"}
