"""Host memory per rank and per node (holmes.contract.host_memory), counted by the planner's
estimate: the process, and with asynchronous checkpoints the staging of what the rank writes
(its 1/D of the stage's weights and its optimizer shard)."""

from __future__ import annotations

import pytest

from holmes.contract import host_memory
from holmes.plan import plan
from tests.helpers.plan.plan_helpers import job_spec, node

GIB = 2**30


def test_a_node_adds_up_the_ranks_it_runs():
    # two stages of 4 ranks on 8-GPU nodes: one node; two stages of 8: a node each
    assert host_memory.per_node([1.0, 2.0], 4, 8) == [12.0]
    assert host_memory.per_node([1.0, 2.0], 8, 8) == [8.0, 16.0]
    assert host_memory.per_node([1.0, 2.0, 3.0], 4, 8) == [12.0, 12.0]  # stages 0+1, then 2


def _estimate(asynchronous: bool) -> dict:
    nodes = [node(f"n{i}", "infiniband") for i in range(2)]
    spec = job_spec(
        layers=8, hidden=2048, heads=16, seq=1024, vocab=32000, B=64, mb=1, count=2, pipeline=2, data=8
    )
    spec["training"]["checkpoint"] = {"path": "/ckpt", "intervalIterations": 10, "asynchronous": asynchronous}
    layout = plan(nodes, spec)
    assert (layout.tensor, layout.pipeline, layout.data) == (1, 2, 8)
    return layout.estimate


def test_the_estimate_counts_the_staging_of_asynchronous_checkpoints_per_node():
    """Before: no host-memory term at all; an asynchronous save's pinned copy of each rank's
    state went to the pod's memory cgroup unplanned."""
    on, off = _estimate(True), _estimate(False)
    assert off["hostMemoryPerNodeGiB"] == pytest.approx(8 * host_memory.PROCESS_BYTES / GIB)
    for s_on, s_off in zip(on["stages"], off["stages"]):
        assert s_off["hostMemoryGiB"] == pytest.approx(host_memory.PROCESS_BYTES / GIB)
        assert s_on["hostMemoryGiB"] > s_off["hostMemoryGiB"]
    # per rank: 1/8 of the stage's bf16 weights (2 bytes) and 12 bytes per shard parameter,
    # 1/8 of the stage: (2 + 12) / 8 bytes per stage parameter, not the 2 + 12/8 of every
    # rank staging the whole stage
    staged = [
        (s["hostMemoryGiB"] - s_off["hostMemoryGiB"]) * GIB for s, s_off in zip(on["stages"], off["stages"])
    ]
    node_staged = (on["hostMemoryPerNodeGiB"] - off["hostMemoryPerNodeGiB"]) * GIB
    assert node_staged == pytest.approx(8 * staged[0], rel=1e-3)  # one stage per node, 8 ranks
    assert on["hostMemoryPerNodeGiB"] == pytest.approx(
        max(8 * s["hostMemoryGiB"] for s in on["stages"]), rel=1e-3
    )


def test_a_rank_stages_its_share_of_the_weights_and_its_shard():
    from holmes.contract import JobSpec, ModelCost
    from holmes.plan import CostModelConfig
    from holmes.plan.costmodel import Shape, StageCost, StagePlace

    spec = job_spec(layers=36, hidden=4096, heads=32, seq=2048, vocab=50257, B=64, mb=1)
    model = ModelCost.of(JobSpec.from_spec(spec).model)
    shape = Shape(tensor=1, data=4, pipeline=4, micro_batch=1, micro_batches=8)
    c = StageCost(model, shape, StagePlace(1, False, False, None, 0.0, 0.0, inflight=3), CostModelConfig())
    p = c.params(9)
    assert c.checkpoint_staging(9) == pytest.approx(p * 2 / 4 + p / 4 * 12)  # not p * 2 + p / 4 * 12
