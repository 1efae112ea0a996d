"""``framework: torchtitan`` and ``framework: deepspeed`` on the local control plane, on the same
three-island plan as the Megatron test (one simulated GPU per node to keep them small): the real
torchtitan mesh and the real DeepSpeed pipeline cut, in pods the operator made, with the hook
installed by the launcher in every worker."""

from __future__ import annotations

import pytest

from tests.helpers.frameworks.cluster_jobs import framework_job, island_net, json_lines, run_job

pytestmark = pytest.mark.timeout(480)


def run_framework(cluster, namespace, tmp_path, name: str, framework: str, program: str):
    """Run the job; (seconds, Layout, node -> NIC, rank -> the program's report, ranks -> the
    hook's group line, layers per stage), every rank having reported."""
    job = framework_job(name, namespace, framework, cluster.framework_image(framework), program, gpus=1)
    _, seconds, layout, logs = run_job(cluster, namespace, tmp_path, job)
    nic = {n.name: n.nic for n in cluster.topology.nodes}
    ranks = {m["rank"]: m for text in logs.values() for m in json_lines(text, framework)}
    groups = {tuple(g["ranks"]): g for text in logs.values() for g in json_lines(text, "holmesGroup")}
    assert sorted(ranks) == list(range(layout.world_size))
    return seconds, layout, nic, ranks, groups, [s.num_layers for s in layout.stages]


def test_torchtitan_mesh_on_the_plan(one_site, namespace, tmp_path):
    seconds, layout, nic, ranks, groups, counts = run_framework(
        one_site, namespace, tmp_path, "tt", "torchtitan", "torchtitan_mesh.py"
    )
    for r, m in ranks.items():
        mine = layout.groups_of(r)
        assert tuple(m["groups"]["pp"]) == mine["pp"].ranks
        assert tuple(m["groups"]["dp_shard"]) == mine["dp"].ranks
        assert [sum(f.startswith("layers.") for f in p) for p in m["parts"]] == counts
        for members in map(tuple, m["groups"].values()):
            assert groups[members]["net"] == island_net(layout, nic, members)
    print(f"TORCHTITAN-SUMMARY seconds={seconds:.1f} groups={len(groups)} counts={counts}")


def test_deepspeed_pipeline_on_the_plan(one_site, namespace, tmp_path):
    seconds, layout, nic, ranks, groups, counts = run_framework(
        one_site, namespace, tmp_path, "ds", "deepspeed", "deepspeed_pipeline.py"
    )
    for r, m in ranks.items():
        assert m["patched"] and m["stage"] == layout.rank_info(r).stage
        assert m["blocks"] == counts[m["stage"]]  # DeepSpeed built exactly the planner's layers here
        dp = tuple(m["dpGroup"])
        assert dp == layout.groups_of(r)["dp"].ranks and groups[dp]["net"] == island_net(layout, nic, dp)
    print(f"DEEPSPEED-SUMMARY seconds={seconds:.1f} groups={len(groups)} counts={counts}")
