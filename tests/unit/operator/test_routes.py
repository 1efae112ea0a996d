"""How a trainer pod reaches the network on each of the NVIDIA Network Operator's routes (issue 34):
shared RDMA device plugin, SR-IOV + Multus, hostNetwork; and what NCCL is told on each."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from holmes.contract import load_job
from holmes.contract.documents import load_documents
from holmes.operator import placement_facts
from holmes.operator.core.render import RenderSettings
from holmes.operator.core.routes import MULTUS_NETWORKS, RouteError, job_routes, pod_route, socket_nodes
from holmes.operator.preview import PreviewError, children
from holmes.plan import NicMapping, plan

REPO = Path(__file__).resolve().parents[3]
NODES = str(REPO / "examples" / "nodes" / "network-operator.yaml")
JOB = str(REPO / "examples" / "jobs" / "gpt-network-operator.yaml")
COST_MODEL = placement_facts.builtin_cost_model()
FACTS = placement_facts.gather(COST_MODEL)
# what only a host has: the labeller's annotations on the example nodes
HOST_NAMES = {"ens9f0np0", "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}
HOST_NAME_VARS = {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX"}


def nodes() -> list[dict]:
    return copy.deepcopy(load_documents(NODES)[0]["items"])


def job(**spec) -> dict:
    doc = copy.deepcopy(load_documents(JOB)[0])
    doc["spec"].update(spec)
    return doc


def pods(manifest: dict, node_list: list[dict] | None = None, cost_model=None) -> dict:
    out = children(manifest, node_list or nodes(), RenderSettings(), cost_model or COST_MODEL)
    return {
        p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ][0]["matchExpressions"][0]["values"][0]: p
        for p in out
        if p["kind"] == "Pod"
    }


def env(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def limits(pod: dict) -> dict:
    return pod["spec"]["containers"][0]["resources"]["limits"]


@pytest.mark.parametrize("network", ["podNetwork", "hostNetwork"])
def test_no_route_copies_a_host_name_into_a_pod(network):
    """Defect 1: the labeller's host netdev (holmes.dev/socket-ifname) and HCA names were copied
    into NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME/NCCL_IB_HCA; a pod's own namespace has neither, and
    NCCL's bootstrap and gloo died at start-up. The pod gets hints for its resolver instead."""
    islands = job()["spec"]["islands"] if network == "podNetwork" else [job()["spec"]["islands"][0]]
    rendered = pods(job(network=network, islands=islands))
    assert len(rendered) == 4
    for node, pod in rendered.items():
        e = env(pod)
        assert not HOST_NAME_VARS & set(e), node
        assert e["HOLMES_POD_NETWORK"] == network and e["HOLMES_NIC"] in ("infiniband", "roce")
        assert e["HOLMES_HOST_HCAS"] == "mlx5_0,mlx5_1,mlx5_2,mlx5_3"  # a hint, named as one
        named = {v for k, v in e.items() if k.startswith(("NCCL_", "GLOO_"))}
        assert not named & HOST_NAMES, node


def test_shared_rdma_device_plugin_one_device_or_one_per_rail():
    """Defect 1: the RDMA resource was requested once whatever the route; a plugin configured
    with one device per rail needs one per rail the pod uses."""
    per_rail = pods(job())
    for node in ("east-0", "east-1"):
        assert limits(per_rail[node])["rdma/rdma_shared_device_ib"] == 4  # the node's 4 compute rails
        assert "add" not in per_rail[node]["spec"]["containers"][0]["securityContext"]["capabilities"]
        assert MULTUS_NETWORKS not in per_rail[node]["metadata"]["annotations"]
    one = pods(
        job(islands=[{"cluster": "west", "sriov": {"networks": ["a"], "resource": "nvidia.com/sriov_rail"}}])
    )
    assert limits(one["east-0"])["rdma/rdma_shared_device_ib"] == 1  # the plugin's usual one device


def test_per_rail_without_known_rails_names_the_field_and_the_fix():
    bare = nodes()
    for n in bare:
        del n["metadata"]["annotations"]["holmes.dev/nic-hcas"]
    with pytest.raises(
        PreviewError, match=r"spec\.islands\[0\]\.rdmaDevices: perRail needs node east-\d's rails"
    ):
        pods(job(), bare)


def test_sriov_gets_the_multus_annotation_and_one_vf_per_network():
    rendered = pods(job())
    for node in ("west-0", "west-1"):
        pod = rendered[node]
        assert (
            pod["metadata"]["annotations"][MULTUS_NETWORKS] == "llm/rail-0,llm/rail-1,llm/rail-2,llm/rail-3"
        )
        assert limits(pod)["nvidia.com/sriov_rail"] == 4
        assert "add" not in pod["spec"]["containers"][0]["securityContext"]["capabilities"]
        assert "hostNetwork" not in pod["spec"]


def test_an_sriov_node_without_a_network_attachment_is_refused_before_any_pod():
    """A node whose RDMA is a VF pool (the NIC mapping's rdmaResourceNames) cannot reach its
    fabric without a NetworkAttachmentDefinition: the job stalls naming the field, no pod is made."""
    sriov_pools = NicMapping(rdma_resource_names=("nvidia.com/sriov_rail",))
    cost_model = placement_facts.builtin_cost_model(sriov_pools)
    only_east = [job()["spec"]["islands"][0]]
    with pytest.raises(PreviewError) as e:
        pods(job(islands=only_east), cost_model=cost_model)
    msg = str(e.value)
    assert "InvalidSpec" in msg and "spec.islands: node west-" in msg and "nvidia.com/sriov_rail" in msg
    assert "sriov: {networks: [namespace/name, ...]}" in msg
    # with the networks named, the VF resource comes from the node itself
    west = {"cluster": "west", "sriov": {"networks": ["llm/rail-0", "llm/rail-1"]}}
    rendered = pods(job(islands=[*only_east, west]), cost_model=cost_model)
    assert limits(rendered["west-0"])["nvidia.com/sriov_rail"] == 2


def test_host_network_is_the_nodes_namespace_with_rdma_devices():
    """Whether the namespace allows host namespaces is Pod Security Admission's call."""
    manifest = job(network="hostNetwork", islands=[])
    rendered = pods(manifest)
    for node, pod in rendered.items():
        assert pod["spec"]["hostNetwork"] is True and pod["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
        assert env(pod)["HOLMES_POD_NETWORK"] == "hostNetwork"
        resource = "rdma/rdma_shared_device_ib" if node.startswith("east") else None
        if resource:
            assert limits(pod)[resource] == 1


def test_roce_gets_the_fabrics_traffic_class_only_where_named():
    """Defect 2: no traffic class was ever set, so RoCE traffic missed the lossless class."""
    rendered = pods(job())
    assert (env(rendered["west-0"])["NCCL_IB_TC"], env(rendered["west-0"])["NCCL_IB_SL"]) == ("106", "3")
    assert "NCCL_IB_TC" not in env(rendered["east-0"])  # its island names none: NCCL's default


def test_socket_groups_get_flows_for_their_link_unless_a_plugin_owns_the_island():
    """Defect 6: NCCL's socket transport runs one TCP flow per connection by default."""
    rendered = pods(job())
    e = env(rendered["east-0"])
    # an RDMA node's TCP path is the host network (fabric.socketGbps 25): 4 flows of 6.25 Gbit/s
    assert (e["NCCL_SOCKET_NTHREADS"], e["NCCL_NSOCKS_PERTHREAD"]) == ("1", "4")
    plugin = [{"cluster": "east", "netPlugin": "AWS Libfabric"}]
    e = env(pods(job(islands=plugin))["east-0"])
    assert "NCCL_SOCKET_NTHREADS" not in e and "NCCL_NSOCKS_PERTHREAD" not in e


def test_a_job_inside_one_rdma_island_gets_no_socket_tuning():
    east = [n for n in nodes() if n["metadata"]["name"].startswith("east")]
    manifest = job(nodes={"count": 2, "gpusPerNode": 8}, islands=[])
    layout = plan(east, manifest)
    assert layout.world_net == "IB" and socket_nodes(layout) == set()
    for pod in pods(manifest, east).values():
        assert "NCCL_SOCKET_NTHREADS" not in env(pod)


def test_the_templates_nccl_and_gloo_settings_win():
    manifest = job()
    manifest["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "NCCL_SOCKET_IFNAME", "value": "=net1"},
        {"name": "NCCL_IB_TC", "value": "41"},
    ]
    e = env(pods(manifest)["west-0"])
    assert (e["NCCL_SOCKET_IFNAME"], e["NCCL_IB_TC"]) == ("=net1", "41")


def test_the_templates_multus_annotation_and_an_island_setting_conflict():
    manifest = job()
    manifest["spec"]["template"]["metadata"] = {"annotations": {MULTUS_NETWORKS: "other"}}
    with pytest.raises(
        PreviewError, match=r"spec\.template\.metadata\.annotations\[k8s\.v1\.cni\.cncf\.io/networks\]"
    ):
        pods(manifest)


def test_routes_are_pure_and_first_matching_island_wins():
    spec = load_job(job(islands=[{"nic": "roce", "trafficClass": 1}, {"cluster": "west", "trafficClass": 2}]))
    layout = plan(nodes(), spec)
    by_name = {n["metadata"]["name"]: n for n in nodes()}
    nets = {n: FACTS.network(by_name[n]) for n in layout.nodes}
    routes = job_routes(spec, layout, nets)
    assert routes["west-0"].env["NCCL_IB_TC"] == "1" and "NCCL_IB_TC" not in routes["east-0"].env
    route = pod_route(nets["west-0"], "west-0", islands=spec.islands, sockets=False)
    assert route.env["NCCL_IB_TC"] == "1" and "NCCL_SOCKET_NTHREADS" not in route.env
    with pytest.raises(RouteError, match=r"spec\.islands\[0\]\.sriov\.resource"):
        pod_route(
            nets["west-0"], "west-0", islands=load_job(job(islands=[{"sriov": {"networks": ["a"]}}])).islands
        )
