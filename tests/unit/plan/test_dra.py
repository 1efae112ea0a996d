"""NIC and GPU discovery from DRA ResourceSlices (holmes.plan.dra, discovery.py, gpus.py), and
`holmes plan --nodes` on a List of Nodes and ResourceSlices."""

from __future__ import annotations

import copy

import pytest

from holmes.cli import CliError, load_nodes
from holmes.plan import CostModelConfig, NicMapping, classify_node, plan
from holmes.plan.dra import join
from holmes.plan.estimate import without_gpu_types
from holmes.plan.gpus import node_gpu
from tests.helpers.plan.dra_helpers import aligned_slices, dra_node, eth0, gpu, rail, rslice
from tests.helpers.plan.plan_helpers import node


def classify(n: dict, slices: list[dict], mapping: NicMapping | None = None):
    (joined,) = join([n], slices)
    return classify_node(joined, mapping)


def test_a_node_described_only_by_slices_gets_kind_hcas_gpus_and_product():
    n = classify(dra_node("a"), aligned_slices("a"))
    assert (n.nic, n.source, n.gpus, n.gpu_source) == ("infiniband", "dra", 8, "dra")
    assert n.hcas == tuple(f"mlx5_{i}" for i in range(8)) and n.usable
    # DRANET publishes no link speed: the cost model's default per kind, and the source says so
    assert (n.gbps, n.gbps_source) == (NicMapping().gbps_for("infiniband"), "default")
    assert n.gpu_product == "NVIDIA A100-SXM4-80GB" and n.gpu_memory_gib == 80.0
    g = node_gpu(n, CostModelConfig())
    assert (g.name, g.peak_tflops, g.memory_gib, g.source) == ("A100-SXM4-80GB", 312.0, 80.0, "table")
    roce = classify(dra_node("b"), aligned_slices("b", enc="ether"))
    assert roce.nic == "roce" and roce.source == "dra"


def test_the_link_type_absent_is_asked_for_never_guessed():
    slices = [rslice("a", "dra.net", [eth0(), rail(0, enc=None), rail(1, enc=None)])]
    n = classify(dra_node("a"), slices)
    assert n.source == "dra" and not n.usable
    assert "no dra.net/encapsulation" in n.problems[0] and "holmes.dev/nic=infiniband|roce" in n.problems[0]
    by_cluster = NicMapping(cluster_rdma_kinds=(("east", "roce"),))
    assert classify(dra_node("a"), slices, by_cluster).nic == "roce"
    link = dra_node("a")
    link["metadata"]["labels"]["holmes.dev/link-layer"] = "InfiniBand"
    assert classify(link, slices).nic == "infiniband"


def test_rails_that_disagree_or_contradict_a_label_are_problems():
    mixed = [rslice("a", "dra.net", [rail(0, "infiniband"), rail(1, "ether")])]
    n = classify(dra_node("a"), mixed)
    assert not n.usable and "disagree on the link layer (infiniband and roce)" in n.problems[0]
    labelled = dra_node("a")
    labelled["metadata"]["labels"]["holmes.dev/nic"] = "roce"  # the admin's answer wins
    assert classify(labelled, mixed).usable and classify(labelled, mixed).source == "holmes-labels"
    wrong = dra_node("a")
    wrong["metadata"]["labels"]["holmes.dev/link-layer"] = "Ethernet"
    assert any("contradicts the link type" in p for p in classify(wrong, aligned_slices("a")).problems)


def test_dra_comes_after_holmes_labels_and_before_nfd_and_device_plugins():
    n = node(
        "a",
        labels={"feature.node.kubernetes.io/rdma.capable": "true"},
        allocatable={"rdma/rdma_shared_device_a": "1k"},
    )
    got = classify(n, aligned_slices("a", enc="ether"))
    assert (got.source, got.nic, got.gpus, got.gpu_source) == ("dra", "roce", 8, "device-plugin")
    off = NicMapping(dra_nic_driver="")  # DRA NIC discovery turned off
    assert classify(n, aligned_slices("a"), off).source == "nfd"
    assert classify(node("a", "infiniband"), aligned_slices("a", enc="ether")).source == "holmes-labels"


def test_only_a_pools_newest_generation_and_node_local_slices_count():
    old = rslice("a", "dra.net", [rail(i) for i in range(4)], generation=1)
    new = rslice("a", "dra.net", [rail(i, "ether") for i in range(2)], generation=2)
    shared = copy.deepcopy(new)
    shared["spec"].pop("nodeName")
    shared["spec"]["allNodes"] = True
    n = classify(dra_node("a"), [old, new, shared])
    assert n.nic == "roce" and n.hcas == ("mlx5_0", "mlx5_1")


def test_virtual_nics_vfs_beside_their_pf_and_mig_slices_are_not_counted():
    nics = [rail(0), rail(1, virtual=True), rail(2, isSriovVf=True)]
    mig = {"name": "gpu-0-mig-1g", "attributes": {"type": {"string": "mig"}, "productName": {"string": "X"}}}
    slices = [rslice("a", "dra.net", nics), rslice("a", "gpu.nvidia.com", [gpu(0), mig])]
    n = classify(dra_node("a"), slices)
    assert n.hcas == ("mlx5_0",) and n.gpus == 1
    vm = classify(dra_node("a"), [rslice("a", "dra.net", [rail(0, isSriovVf=True)])])
    assert vm.hcas == ("mlx5_0",) and vm.nic == "infiniband"  # a VM's NICs are VFs


def test_gfd_label_wins_over_the_dra_product_and_mixed_products_are_a_problem():
    labelled = dra_node("a")
    labelled["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H100-80GB-HBM3"
    n = classify(labelled, aligned_slices("a"))
    assert node_gpu(n, CostModelConfig()).name == "H100-80GB-HBM3"
    mixed = [rslice("a", "gpu.nvidia.com", [gpu(0), gpu(1, "NVIDIA H100 80GB HBM3")])]
    m = classify(dra_node("a"), mixed)
    assert not m.usable and "several products" in m.problems[0]
    unknown = classify(dra_node("a"), [rslice("a", "gpu.nvidia.com", [gpu(0, "NVIDIA Z9000")])])
    assert "DRA productName=NVIDIA Z9000 is not in the GPU table" in (
        node_gpu(unknown, CostModelConfig()).note or ""
    )


def test_without_gpu_types_hides_the_dra_product_too():
    (joined,) = join([dra_node("a")], aligned_slices("a"))
    (blind,) = without_gpu_types([joined])
    assert classify_node(blind).gpu_product is None and classify_node(blind).gpus == 8


def zones_job(path: str = "examples/jobs/gpt-7b.yaml") -> dict:
    import yaml

    job = yaml.safe_load(open(path))
    job["spec"]["nodes"]["clusterLabel"] = "topology.kubernetes.io/zone"
    return job


def test_the_dra_example_plans_as_the_paper_testbed_does_from_labels():
    import yaml

    paper = plan(load_nodes("examples/nodes/paper.yaml"), yaml.safe_load(open("examples/jobs/gpt-7b.yaml")))
    dra_nodes = load_nodes("examples/nodes/dra.yaml")
    assert not any(k.startswith("holmes.dev/") for n in dra_nodes for k in n["metadata"]["labels"])
    dra = plan(dra_nodes, zones_job())
    assert dra.nodes == paper.nodes
    assert [(s.island, s.nic, s.layers, s.dp_net) for s in dra.stages] == [
        (s.island, s.nic, s.layers, s.dp_net) for s in paper.stages
    ]
    assert (dra.pipeline, dra.data, dra.tensor) == (paper.pipeline, paper.data, paper.tensor)
    assert dra.estimate["iterationSeconds"] == pytest.approx(paper.estimate["iterationSeconds"])
    assert (
        plan(load_nodes("examples/nodes/dra.yaml"), zones_job("examples/jobs/gpt-7b-zones.yaml")).nodes
        == dra.nodes
    )


def test_load_nodes_names_what_it_cannot_read(tmp_path):
    f = tmp_path / "n.yaml"
    f.write_text("apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: p}}\n")
    with pytest.raises(CliError, match="item 0 is neither a v1 Node nor a resource.k8s.io/v1 ResourceSlice"):
        load_nodes(str(f))
