"""No one spec can stall the rest: sizes past any real model or cluster are refused before
planning, the layout search stops at its budget with a message saying so, and an elastic job
tries its smaller sizes within that one budget (and never more sizes than there are nodes)."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from holmes.contract import SpecError, load_job
from holmes.contract.flops import ModelCost
from holmes.operator.core import elastic
from holmes.operator.preview import PreviewError, children
from holmes.plan import Budget, CostModelConfig, InsufficientNodes, PlanError, PlanTooLarge, plan
from holmes.plan.discovery import NodeNic
from holmes.plan.planner import cost_placement, degree_candidates, for_job, memory_floor_problem
from tests.helpers.plan.plan_helpers import job_spec, node

KINDS = ("infiniband", "roce", "ethernet")
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def nics(n: int) -> list[NodeNic]:
    return [
        NodeNic(name=f"gpu-{i:05d}", cluster=f"dc{i % 3}", nic=KINDS[i % 3], gbps=100.0, gpus=8)
        for i in range(n)
    ]


def manifest(spec: dict) -> dict:
    meta = {"name": "huge", "namespace": "t"}
    return {"apiVersion": "holmes.dev/v1alpha1", "kind": "HolmesJob", "metadata": meta, "spec": spec}


def test_a_hostile_size_is_refused_by_name_in_under_a_second() -> None:
    """The issue's spec: 100,000 layers on 15,360 nodes held the placement lock for 17 s (54 s
    on this shared machine) before the planner found no layout fits."""
    n = 15_360
    nodes = [node(f"gpu-{i:05d}", KINDS[i % 3], f"dc{i % 3}") for i in range(n)]
    spec = job_spec(layers=100_000, hidden=12288, heads=96, B=16 * n, mb=1, count=n)
    started = time.perf_counter()
    with pytest.raises(SpecError) as e:
        load_job(spec)
    with pytest.raises(PreviewError) as refused:  # the operator's own decision, on every node
        children(manifest(spec), nodes)
    took = time.perf_counter() - started
    assert any(p.startswith("spec.model.layers: must be an integer from 1 to 1024") for p in e.value.problems)
    assert "spec.model.layers" in str(refused.value)
    assert took < 1.0, f"{took:.2f} s"


@pytest.mark.parametrize(
    "section, key, value",
    [
        ("nodes", "count", 65_537),
        ("nodes", "gpusPerNode", 65),
        ("model", "hiddenSize", 2**18),
        ("model", "seqLength", 2**25),
        ("model", "vocabSize", 2**25),
        ("training", "globalBatchSize", 2**25),
    ],
)
def test_sizes_past_any_real_model_or_cluster_are_refused(section: str, key: str, value: int) -> None:
    spec = job_spec()
    spec[section][key] = value
    with pytest.raises(SpecError) as e:
        load_job(spec)
    assert any(p.startswith(f"spec.{section}.{key}: must be an integer from 1 to") for p in e.value.problems)


def test_the_search_stops_at_its_budget_saying_so() -> None:
    n = 1024
    spec = job_spec(layers=96, hidden=12288, heads=96, B=16 * n, mb=1, count=n)
    full = Budget(units=10**9)
    plan(nics(n), spec, budget=full)  # what the whole search costs
    small = Budget(units=full.spent // 4)
    with pytest.raises(PlanTooLarge, match="too large to plan within the budget") as e:
        plan(nics(n), spec, budget=small)
    assert "fix parallelism.tensor and parallelism.pipeline" in str(e.value)
    # it stops at the candidate that would cross the budget: at most one candidate past it
    assert small.units < small.spent <= small.units + n + 96 + n
    again = Budget(units=full.spent // 4)  # counted in work, not seconds: the same on any machine
    with pytest.raises(PlanTooLarge):
        plan(nics(n), spec, budget=again)
    assert again.spent == small.spent


def test_fixed_degrees_plan_a_large_cluster_within_the_default_budget() -> None:
    n = 4096
    spec = job_spec(
        layers=96, hidden=12288, heads=96, vocab=50304, B=16 * n, mb=1, count=n, tensor=8, pipeline=8
    )
    budget = Budget()
    layout = plan(nics(n), spec, budget=budget)
    assert len(layout.nodes) == n and budget.spent < budget.units // 10


def test_an_elastic_job_does_not_retry_smaller_sizes_past_its_budget() -> None:
    calls = []

    def too_large(nodes: list, job) -> None:
        calls.append(job.nodes.count)
        if job.nodes.count == 16:
            raise InsufficientNodes("16 nodes wanted, 12 usable")
        raise PlanTooLarge("too large to plan within the budget: ...")

    spec = load_job(
        job_spec(count=16, gpus=8, B=1024, mb=1) | {"nodes": {"count": 16, "gpusPerNode": 8, "minCount": 1}}
    )
    with pytest.raises(PlanTooLarge):
        elastic.plan_size(too_large, [{}] * 12, spec, restarted=True, since=NOW, now=NOW)
    assert calls == [16, 12]  # the full size, then the largest the 12 listed nodes allow: stop


def test_an_elastic_job_tries_no_more_sizes_than_there_are_nodes() -> None:
    calls = []

    def none_fits(nodes: list, job) -> None:
        calls.append(job.nodes.count)
        raise InsufficientNodes(f"{job.nodes.count} nodes wanted")

    spec = load_job(
        job_spec(count=4096, gpus=8, B=4096 * 8, mb=1)
        | {"nodes": {"count": 4096, "gpusPerNode": 8, "minCount": 1}}
    )
    sized = elastic.plan_size(none_fits, [{}] * 3, spec, restarted=True, since=NOW, now=NOW)
    assert sized.waiting is not None
    assert calls == [4096, 3, 2, 1]  # not 4,096 searches, each over every node


def test_degrees_that_cannot_fit_in_memory_cost_no_search() -> None:
    """1,024 layers of h=12288 on 4,096 nodes (within the bounds): no degree choice fits 80 GiB.
    The memory floor drops most of them before a node is summarised (on 15,360 nodes the search
    took 10.3 s under the placement lock, 1.3 s with it; 103,423 units of work before, here)."""
    n = 4096
    spec = job_spec(layers=1024, hidden=12288, heads=96, B=16 * n, mb=1, count=n)
    budget = Budget()
    with pytest.raises(PlanError, match="no layout fits in GPU memory") as e:
        plan(nics(n), spec, budget=budget)
    assert "a stage of 1024 layers needs at least" in str(e.value)
    assert budget.spent < 40_000  # 29,440: the few degree choices the floor cannot rule out


def test_the_memory_floor_never_drops_degrees_that_fit() -> None:
    """For every degree choice the search costs, across models near the 80 GiB limit: when a
    placement of it fits, the floor did not drop it (a floor above a fitting stage would lose
    layouts)."""
    usable = nics(16)
    checked = dropped = 0
    for layers, hidden, heads, mb in (
        (36, 4096, 32, 4),
        (96, 12288, 96, 1),
        (80, 8192, 64, 2),
        (48, 6144, 48, 2),
    ):
        job = load_job(job_spec(layers=layers, hidden=hidden, heads=heads, B=1024, mb=mb, count=16))
        cfg = for_job(CostModelConfig(), job)
        model = ModelCost.of(job.model)
        for deg in degree_candidates(job):
            placed = cost_placement(job, deg, tuple(usable), model, cfg, {})
            floor = memory_floor_problem(job, deg, model, cfg, cfg.gpu_memory_gib)
            if not isinstance(placed, str):
                checked += 1
                assert floor == "", (deg, floor)
            else:
                dropped += bool(floor)
    assert checked > 10 and dropped > 0  # both sides of the line are exercised
