"""``framework: megatron`` on the local control plane: a three-island plan (an InfiniBand, a RoCE
and an Ethernet stage, uneven layers), pods created by the operator, the user's command run by
Holmes' launcher under torchrun, Megatron's own ``initialize_model_parallel`` building the groups
from the appended arguments (megatron-core 0.16.1, gloo on CPU).

One job serves the module: a mixture of experts (tensor 2, expert 2). megatron-core builds its
dense groups (dp, tp, pp, embd) from a rank generator with expert parallelism 1, apart from the
expert generator, so the MoE job's dense groups are the ones a dense job of the same shape forms
(and the Layout's dp/tp/pp families do not depend on ``expert``): both tests' claims are checked
on the same 12 real Megatron ranks, which costs one job's processes instead of two."""

from __future__ import annotations

import json

import pytest

from tests.helpers.frameworks.cluster_jobs import framework_job, island_net, json_lines, run_job

pytestmark = pytest.mark.timeout(480)


@pytest.fixture(scope="module")
def moe(one_site, tmp_path_factory):
    """The MoE job run once, in a namespace of its own; (cluster, seconds, Layout, logs)."""
    cluster = one_site
    ns = cluster.new_namespace("t-mg")
    try:
        job = framework_job(
            "moe",
            ns,
            "megatron",
            cluster.framework_image("megatron"),
            "megatron_groups.py",
            gpus=2,
            tensor=2,
            expert=2,
            sequenceParallel=True,
        )  # megatron-core's MoE layer needs sequence parallelism with tensor 2
        job["spec"]["model"]["moe"] = {"experts": 4, "expertsPerToken": 2}
        _, seconds, layout, logs = run_job(cluster, ns, tmp_path_factory.mktemp("moe"), job)
        yield cluster, seconds, layout, logs
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_megatron_forms_holmes_groups_on_their_networks(moe):
    cluster, seconds, layout, logs = moe
    nic = {n.name: n.nic for n in cluster.topology.nodes}
    G = layout.gpus_per_node
    node_nic = [nic[n] for n in layout.nodes]

    # the plan: one stage per island, uneven layers
    assert sorted(s.nic for s in layout.stages) == ["ethernet", "infiniband", "roce"]
    counts = [s.num_layers for s in layout.stages]
    assert sum(counts) == 8 and len(set(counts)) > 1, counts

    ranks, groups = {}, []
    for text in logs.values():
        for m in json_lines(text, "megatron"):
            ranks[m["rank"]] = m
        groups += json_lines(text, "holmesGroup")
    assert sorted(ranks) == list(range(layout.world_size))

    logged = {tuple(g["ranks"]): g for g in groups}
    one_node = {pg.ranks for pg in layout.process_groups() if len({r // G for r in pg.ranks}) == 1}
    expected = {
        (pg.kind, pg.ranks): None if pg.ranks in one_node else pg.net for pg in layout.process_groups()
    }
    for r, m in ranks.items():
        info = layout.rank_info(r)
        assert (
            m["stage"] == info.stage and m["stageLayers"] == counts
        )  # Megatron's reading of the layout string
        mg = {k: tuple(v) for k, v in m["groups"].items()}
        assert mg["dp"] == layout.groups_of(r)["dp"].ranks and mg["tp"] == layout.groups_of(r)["tp"].ranks
        assert mg["pp"] == layout.groups_of(r)["pp"].ranks
        assert len({node_nic[x // G] for x in mg["dp"]}) == 1  # every DP group inside one island
        for kind, members in mg.items():
            assert members in logged, f"rank {r}: Megatron's {kind} group {members} was not seen by the hook"
            assert logged[members]["net"] == island_net(layout, nic, members)
            if (kind, members) in expected:
                assert logged[members]["net"] == expected[(kind, members)], (kind, members)
        assert m["communicatorNets"]["dp"] == layout.stages[info.stage].dp_net  # this pod's file
    assert all(g["net"] == island_net(layout, nic, g["ranks"]) for g in groups)

    summary = {
        "seconds": round(seconds, 1),
        "stages": [(s.island, s.nic, s.num_layers, s.dp_net) for s in layout.stages],
        "groups": len(groups),
        "megatron": {
            k: sorted(
                {
                    (tuple(m["groups"][k]), logged[tuple(m["groups"][k])]["net"])
                    for m in ranks.values()
                    if k in m["groups"]
                }
            )
            for k in ("dp", "tp", "pp", "embd")
        },
    }
    print("MEGATRON-SUMMARY " + json.dumps(summary))


EXPERT_GROUPS = ("ep", "ep_tp", "tp_ep_mp", "tp_ep_pp", "ep_dp")  # megatron-core 0.16.1's


def test_megatron_forms_its_expert_groups_on_their_islands(moe):
    """A mixture of experts: megatron-core forms its expert groups from the appended
    ``--expert-model-parallel-size``; the hook logs each with its island's net, and the
    communicator file names each with the same net where the group leaves its node."""
    cluster, seconds, layout, logs = moe
    nic = {n.name: n.nic for n in cluster.topology.nodes}
    G = layout.gpus_per_node
    assert layout.expert == 2 and sorted(s.nic for s in layout.stages) == ["ethernet", "infiniband", "roce"]

    ranks, groups = {}, []
    for text in logs.values():
        for m in json_lines(text, "megatron"):
            ranks[m["rank"]] = m
        groups += json_lines(text, "holmesGroup")
    assert sorted(ranks) == list(range(layout.world_size))
    logged = {tuple(g["ranks"]): g for g in groups}

    seen: dict[str, set] = {k: set() for k in EXPERT_GROUPS}
    for r, m in ranks.items():
        assert m["expertParallelSize"] == layout.expert, (r, m["expertParallelSize"])
        for kind in EXPERT_GROUPS:
            assert kind in m["groups"], f"rank {r}: megatron-core formed no {kind} group"
            members = tuple(m["groups"][kind])
            seen[kind].add(members)
            assert members in logged, (
                f"rank {r}: megatron-core's {kind} group {members} was not seen by the hook"
            )
            net = island_net(layout, nic, members)
            assert logged[members]["net"] == net, (kind, members, logged[members])
            assert kind in m["communicatorNets"], f"the communicator file names no {kind}"
            if net is not None:  # leaves its node: Megatron's own file must agree with the hook
                assert m["communicatorNets"][kind] == net, (r, kind, members, m["communicatorNets"])
    # megatron-core's expert-parallel groups are the Layout's, each inside one island and
    # (tensor 2 on two-GPU nodes) across its stage's two nodes, on the island's network
    assert seen["ep"] == {pg.ranks for pg in layout.process_groups("ep")}
    for members in seen["ep"]:
        assert len({nic[layout.nodes[x // G]] for x in members}) == 1
        assert len({x // G for x in members}) == 2
    assert {logged[g]["net"] for g in seen["ep"]} == {"IB", "Socket"}
    assert {logged[g]["net"] for g in seen["tp_ep_pp"]} == {"Socket"}  # across the islands

    summary = {
        "seconds": round(seconds, 1),
        "stages": [(s.island, s.nic, s.num_layers, s.dp_net) for s in layout.stages],
        "expert": {k: sorted((g, logged[g]["net"]) for g in seen[k]) for k in EXPERT_GROUPS},
    }
    print("MEGATRON-MOE-SUMMARY " + json.dumps(summary))
