"""NVIDIA Topograph's switch labels (plan/topology.py): an island lists its nodes switch by
switch, so a stage cut from it sits under as few leaf switches as the island allows; the labels'
keys of every Topograph version are read widest first, and Holmes' Kueue/KAI Topology puts them
between the island and the node."""

from __future__ import annotations

import yaml

from holmes.cli import main
from holmes.operator.core import island_topology
from holmes.plan import NicMapping, classify_nodes, plan
from holmes.plan.topology import islands_of, switch_levels
from tests.helpers.plan.plan_helpers import job_spec, node

LEAF = "network.topology.nvidia.com/leaf"
SPINE = "network.topology.nvidia.com/spine"


def leafed(n: int, leaf_of) -> list[dict]:
    """``n`` InfiniBand nodes of one island, ``leaf_of(i)`` naming node i's leaf (None: no label)."""
    out = []
    for i in range(n):
        leaf = leaf_of(i)
        labels = {SPINE: "s1", LEAF: leaf} if leaf else {}
        out.append(node(f"ib-{i}", "infiniband", "east", labels=labels))
    return out


def test_an_island_lists_its_nodes_switch_by_switch_then_by_name():
    nics = classify_nodes(leafed(6, lambda i: "leaf-a" if i % 2 else "leaf-b"), NicMapping())
    (island,) = islands_of(nics)
    assert [n.name for n in island.nodes] == ["ib-1", "ib-3", "ib-5", "ib-0", "ib-2", "ib-4"]
    # without Topograph's labels: by name, as before
    (plain,) = islands_of(classify_nodes(leafed(6, lambda i: None), NicMapping()))
    assert [n.name for n in plain.nodes] == [f"ib-{i}" for i in range(6)]


def test_each_pipeline_stage_sits_under_one_leaf_switch_where_the_island_allows():
    # name order interleaves the two leaves: cut by name, every stage would span both
    nodes = leafed(8, lambda i: "leaf-a" if i % 2 else "leaf-b")
    lay = plan(nodes, job_spec(pipeline=2, count=8))
    leaf = {n["metadata"]["name"]: n["metadata"]["labels"][LEAF] for n in nodes}
    assert [sorted({leaf[x] for x in s.nodes}) for s in lay.stages] in (
        [["leaf-a"], ["leaf-b"]],
        [["leaf-b"], ["leaf-a"]],
    )


def test_every_topograph_versions_keys_are_read_widest_tier_first():
    legacy = [{"network.topology.nvidia.com/block": "b", "network.topology.nvidia.com/datacenter": "d"}]
    assert switch_levels(legacy + [{SPINE: "s"}]) == (
        "network.topology.nvidia.com/datacenter",
        SPINE,
        "network.topology.nvidia.com/block",
    )
    tiers = [{"fabric.topograph.run/tier-0": "a", "fabric.topograph.run/tier-10": "c", "other": "x"}]
    tiers.append({"fabric.topograph.run/tier-2": "b"})
    assert switch_levels(tiers) == (
        "fabric.topograph.run/tier-10",
        "fabric.topograph.run/tier-2",
        "fabric.topograph.run/tier-0",
    )
    assert switch_levels([{"kubernetes.io/hostname": "n"}]) == ()


def test_holmes_topology_puts_the_switch_levels_between_island_and_node(tmp_path, capsys):
    f = tmp_path / "nodes.yaml"
    f.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": leafed(2, lambda i: "leaf-a")}))
    assert main(["topology", "--nodes", str(f)]) == 0
    items = yaml.safe_load(capsys.readouterr().out)["items"]
    want = [
        island_topology.LABEL_CLUSTER,
        island_topology.LABEL_ISLAND,
        SPINE,
        LEAF,
        island_topology.HOSTNAME,
    ]
    assert [lv["nodeLabel"] for lv in items[0]["spec"]["levels"]] == want  # Kueue
    assert [lv["nodeLabel"] for lv in items[1]["spec"]["levels"]] == want  # KAI
