"""A mixture of experts planned: every expert-parallel group on one island (one node where it
fits), the all-to-all in the estimate, expert weights and optimizer state in the memory model,
on the paper's testbed and on three islands, with a Mixtral-8x7B and a DeepSeek-V2-Lite shape."""

import pytest

from holmes.contract import Layout
from holmes.contract.flops import ModelCost
from holmes.plan import costmodel
from holmes.plan.planner import PlanError, plan
from tests.helpers.plan.moe_helpers import check_expert_groups, moe_job, three_islands
from tests.helpers.plan.plan_helpers import node, paper_nodes

CASES = [
    ("mixtral", paper_nodes, 8, {"pipeline": 2}),
    ("mixtral", three_islands, 12, {"pipeline": 3}),
    ("deepseek-v2-lite", paper_nodes, 8, {"pipeline": 2, "expert": 8}),
    ("deepseek-v2-lite", three_islands, 12, {"pipeline": 3, "expert": 8}),
    ("deepseek-v2-lite", three_islands, 12, {"pipeline": 3, "expert": 16}),  # groups of two nodes
]


@pytest.mark.parametrize("shape,nodes,count,par", CASES)
def test_every_expert_group_lies_on_one_island_and_the_estimate_prices_its_all_to_all(
    shape, nodes, count, par, monkeypatch
):
    ns = nodes()
    job = moe_job(shape, count, **par)
    layout = plan(ns, job)
    assert layout.expert > 1, layout.explanation
    groups = check_expert_groups(layout, ns)
    assert groups
    est = layout.estimate
    assert est["expert"] == layout.expert and est["allToAllSeconds"] > 0
    assert all(s["allToAllSeconds"] > 0 for s in est["stages"])
    text = "\n".join(layout.explanation)
    assert f"expert parallel {layout.expert}" in text and "all-to-all" in text
    # the same layout with the all-to-all free is faster by at least the slowest stage's part of it
    monkeypatch.setattr(costmodel.StageCost, "all_to_all_seconds", lambda self: 0.0)
    free = plan(
        ns,
        job.replace(
            parallelism=job.parallelism.__class__(
                tensor=layout.tensor,
                pipeline=layout.pipeline,
                data=layout.data,
                expert=layout.expert,
                partition=tuple(s.num_layers for s in layout.stages),
                sequence_parallel=job.parallelism.sequence_parallel,
                replan=job.parallelism.replan.__class__(enabled=False),
            )
        ),
    )
    assert free.nodes == layout.nodes
    assert free.estimate["iterationSeconds"] < est["iterationSeconds"]


def test_expert_groups_across_nodes_are_priced_on_their_islands_fabric():
    ns = three_islands()
    one_node = plan(ns, moe_job("deepseek-v2-lite", 12, pipeline=3, expert=8))
    two_nodes = plan(ns, moe_job("deepseek-v2-lite", 12, pipeline=3, expert=16))
    check_expert_groups(two_nodes, ns)
    assert two_nodes.estimate["expertGroupsInsideNode"] is False
    assert one_node.estimate["expertGroupsInsideNode"] is True
    assert two_nodes.estimate["allToAllSeconds"] > 5 * one_node.estimate["allToAllSeconds"]
    assert "nodes of one island" in "\n".join(two_nodes.explanation)


def test_an_expert_group_that_would_span_islands_is_refused():
    ns = [node(f"ib-{i}", "infiniband", "east") for i in range(3)] + [node("roce-0", "roce", "west")]
    job = moe_job("deepseek-v2-lite", 4, pipeline=1, expert=16)  # groups of two nodes: ib-2 + roce-0
    with pytest.raises(PlanError) as e:
        plan(ns, job)
    assert "expert group on ib-2, roce-0 would span islands" in str(e.value)
    auto = plan(ns, moe_job("deepseek-v2-lite", 4, pipeline=1))  # auto stays inside a node
    assert auto.expert * auto.tensor <= 8
    check_expert_groups(auto, ns)


def test_expert_weights_and_their_optimizer_state_are_in_the_memory_estimate():
    ns = paper_nodes()
    job = moe_job("mixtral", pipeline=2)
    by_e = {E: plan(ns, moe_job("mixtral", pipeline=2, expert=E, partition=[16, 16])) for E in (4, 8)}
    model = ModelCost.of(job.model)
    for E, layout in by_e.items():
        assert layout.expert == E
    # halving the expert group doubles each GPU's slice of the 16 layers' experts: weights and fp32
    # gradients (6 bytes) and the optimizer shard (12 + 5 + 2 bytes over D/E ranks)
    D = by_e[8].data
    e8 = 16 * model.expert_layer_params / 8
    e4 = 16 * model.expert_layer_params / 4
    grown = (e4 - e8) * 6 + (e4 * 19 / (D // 4) - e8 * 19 / (D // 8))
    mem = {E: l.estimate["stages"][0]["memoryGiB"] for E, l in by_e.items()}
    assert mem[4] - mem[8] == pytest.approx(grown / 2**30, rel=0.02)
    assert model.total_params == pytest.approx(46.7e9, rel=0.01)
    assert by_e[8].estimate["activeParameters"] == pytest.approx(12.9e9, rel=0.01)


def test_a_dense_model_plans_as_before():
    ns = paper_nodes()
    spec = moe_job("mixtral").to_spec()
    del spec["model"]["moe"]
    layout = plan(ns, spec)
    assert layout.expert == 1 and "expert" not in layout.to_dict()
    assert not list(layout.process_groups("ep")) and "allToAllSeconds" not in layout.estimate


def test_a_planned_mixture_of_experts_is_re_estimated_with_its_expert_degree():
    from holmes.plan.costmodel import CostModelConfig
    from holmes.plan.estimate import reestimate

    ns = paper_nodes()
    job = moe_job("mixtral", pipeline=2)
    layout = plan(ns, job)
    again = reestimate(ns, job, Layout.from_json(layout.to_json()), CostModelConfig())
    assert again.expert == layout.expert > 1
    assert again.estimate["iterationSeconds"] == pytest.approx(layout.estimate["iterationSeconds"])
