"""The re-plan decision rule (operator core/replan.py): threshold, hysteresis, bound, prerequisites;
and the spec field that configures it."""

from dataclasses import replace
from pathlib import Path

import pytest

from holmes.cli import load_nodes
from holmes.contract import SpecError, load_job
from holmes.operator.core import replan
from holmes.plan import CostModelConfig, plan
from holmes.plan.calibrate import assess, with_rates
from holmes.plan.estimate import evaluate_run
from holmes.plan.measured import MIN_SAMPLES, RunLayout

ROOT = Path(__file__).resolve().parents[3]
NODES = load_nodes(str(ROOT / "examples" / "nodes" / "mixed-gpus.yaml"))
JOB = load_job(str(ROOT / "examples" / "jobs" / "gpt-7b.yaml"))


def calibrated(nodes, job, layout, measured):
    return assess(nodes, job, layout, measured, CostModelConfig())


def judge(layout, progress, adaptation=None, job=JOB, nodes=NODES):
    return replan.judge(job, adaptation, layout, progress, nodes, lambda n, j: plan(n, j), calibrated)


H100, A100 = "east/infiniband", "west/infiniband"


def progress_for(layout, slow=None, samples=MIN_SAMPLES, nodes=NODES):
    """status.progress as the operator merges it from the trainer: each stage's compute seconds
    = the cost model's x ``slow[island]`` (pure decision tests: the inputs are data)."""
    slow = slow or {}
    run = RunLayout.of(layout)
    c = evaluate_run(nodes, JOB, run, CostModelConfig())
    stages = [
        {
            "stage": s,
            "layers": n,
            "computeSeconds": run.micro_batches
            * (x.fwd(n) + x.bwd(n))
            * slow.get(layout.stages[s].island, 1),
            "samples": samples,
        }
        for s, (x, n) in enumerate(zip(c.costs, c.layers))
    ]
    return {"iteration": 20, "iterationSeconds": 30.0, "stages": stages}


@pytest.fixture(scope="module")
def layout():
    return plan(NODES, JOB)  # the GPU-aware plan: A100 stage 9 layers, H100 stage 27


def test_measured_as_planned_holds(layout):
    v = judge(layout, progress_for(layout))
    assert (v.act, v.reason) == (False, "PlanHolds") and "not more than the 10%" in v.message


def test_a_slow_island_triggers_a_replan_with_the_numbers(layout):
    v = judge(layout, progress_for(layout, slow={H100: 3.0}))
    assert v.act and v.reason == "Replanned"
    assert v.layout.stages[1].num_layers < layout.stages[1].num_layers
    rec = v.record
    assert rec["estimatedAfter"] < rec["estimatedBefore"] and rec["measuredBefore"] == 30.0
    assert "stage 1 (east/infiniband, H100-80GB-HBM3)" in v.message and "re-plan 1 of 2" in v.message
    assert set(v.node_tflops) == set(layout.nodes)


def test_threshold_is_the_users(layout):
    strict = replace(
        JOB, parallelism=replace(JOB.parallelism, replan=replace(JOB.parallelism.replan, threshold=5.0))
    )
    v = judge(layout, progress_for(layout, slow={H100: 3.0}), job=strict)
    assert (v.act, v.reason) == (False, "PlanHolds") and "500%" in v.message


def test_no_second_replan_once_the_new_layout_runs_as_calibrated(layout):
    first = judge(layout, progress_for(layout, slow={H100: 3.0}))
    state = replan.adapted(None, first, layout)
    new = plan(with_rates(NODES, state["measuredTflops"]), JOB)
    assert replan.signature(new) == replan.signature(first.layout)  # the relaunch plans the same
    # the new layout measured at the same real speeds: stage 1 still 3x the table's H100 time
    again = judge(new, progress_for(new, slow={H100: 3.0}), adaptation=state)
    assert not again.act and again.reason == "PlanHolds"


def test_hysteresis_never_returns_to_a_layout_already_run(layout):
    first = judge(layout, progress_for(layout, slow={H100: 3.0}))
    state = replan.adapted(None, first, layout)
    assert state["tried"] == [replan.signature(layout), replan.signature(first.layout)]
    new = first.layout
    # the A100s turn out slow too: some layout beats the new one by far...
    slow = progress_for(new, slow={A100: 40.0})
    free = judge(new, slow, adaptation={"replans": 1})
    assert free.act
    # ... but not when that layout was run before in this job
    v = judge(new, slow, adaptation={**state, "tried": [*state["tried"], replan.signature(free.layout)]})
    assert (v.act, v.reason) == (False, "PlanHolds") and "run before in this job" in v.message


def test_each_replan_needs_a_larger_gain(layout):
    v = judge(layout, progress_for(layout, slow={H100: 2.0}))
    assert v.act  # about 14% faster: more than 10%
    v2 = judge(layout, progress_for(layout, slow={H100: 2.0}), adaptation={"replans": 1})
    assert not v2.act and "20%" in v2.message


def test_bounded_per_job(layout):
    v = judge(layout, progress_for(layout, slow={H100: 3.0}), adaptation={"replans": 2})
    assert (v.act, v.reason) == (False, "ReplanLimit")


def test_waits_for_enough_samples_of_this_layout(layout):
    v = judge(layout, progress_for(layout, slow={H100: 3.0}, samples=MIN_SAMPLES - 1))
    assert (v.act, v.reason) == (False, "Measuring")
    stale = progress_for(layout, slow={H100: 3.0})
    stale["stages"][0]["layers"] += 1  # measured in another layout
    assert judge(layout, stale).reason == "Measuring"


def test_needs_checkpoints_and_can_be_off(layout):
    spec = JOB.to_spec()
    spec["training"].pop("checkpoint")
    v = judge(layout, progress_for(layout, slow={H100: 3.0}), job=load_job(spec))
    assert (v.act, v.reason) == (False, "NeedsCheckpoint")
    spec = JOB.to_spec()
    spec["parallelism"]["replan"] = {"enabled": False}
    assert judge(layout, progress_for(layout, slow={H100: 3.0}), job=load_job(spec)).reason == "Disabled"


def test_planning_applies_the_measured_rates_only_when_on(layout):
    first = judge(layout, progress_for(layout, slow={H100: 3.0}))
    state = replan.adapted(None, first, layout)
    seen = [replan.measured_nodes(NODES, state, JOB)]
    assert seen[0] is not NODES and "holmes.dev/measured-tflops" in seen[0][0]["metadata"]["labels"]
    off = replace(
        JOB, parallelism=replace(JOB.parallelism, replan=replace(JOB.parallelism.replan, enabled=False))
    )
    plain = replan.measured_nodes(NODES, state, off)
    assert plain is NODES


def spec_with(**par):
    spec = JOB.to_spec()
    spec["parallelism"].pop("replan")
    spec["parallelism"].update(par)
    return spec


def test_spec_field_defaults_and_refusals():
    assert load_job(spec_with()).parallelism.replan.enabled
    assert not load_job(spec_with(partition="uniform")).parallelism.replan.enabled
    r = load_job(spec_with(replan={"threshold": 0.25, "maxReplans": 0})).parallelism.replan
    assert (r.threshold, r.max_replans) == (0.25, 0)
    with pytest.raises(SpecError, match=r"parallelism.replan.enabled: .*needs partition: adaptive"):
        load_job(spec_with(partition="uniform", replan={"enabled": True}))
    with pytest.raises(SpecError, match=r"parallelism.replan.threshold: must be a positive number"):
        load_job(spec_with(replan={"threshold": -1}))
    with pytest.raises(SpecError, match=r"parallelism.replan: unknown field"):
        load_job(spec_with(replan={"treshold": 0.2}))
    assert load_job(load_job(spec_with()).to_spec()) == load_job(spec_with())  # round trip


# ---- the reconcile flow (pure: FakeWorld applies the Decisions) ----------------------------------


def _replan_job(on_preemption=True):
    from tests.helpers.operator.opfixtures import manifest

    return manifest(
        count=4,
        nodes={"count": 4, "gpusPerNode": 1},
        parallelism={"pipeline": 2},
        training={
            "globalBatchSize": 8,
            "microBatchSize": 1,
            "iterations": 100,
            "learningRate": 1.0e-3,
            "checkpoint": {"path": "/ckpt", "intervalIterations": 5, "onPreemption": on_preemption},
        },
        runPolicy={"backoffLimit": 0},
    )


def _progress(layout, seconds_per_layer, iteration, ckpt):
    """The trainer's stage medians: each stage's layers x its island's seconds per layer."""
    return {
        "iteration": iteration,
        "checkpointIteration": ckpt,
        "iterationSeconds": 1.0,
        "stages": [
            {
                "stage": s.index,
                "layers": s.num_layers,
                "samples": MIN_SAMPLES,
                "computeSeconds": s.num_layers * seconds_per_layer[s.island],
                "p2pWaitSeconds": 0.01,
                "dpExposedSeconds": 0.0,
            }
            for s in layout.stages
        ],
    }


def _world(on_preemption=True):
    from holmes.contract import Layout
    from holmes.operator.core import child_names
    from tests.helpers.operator.opfixtures import FakeWorld, default_nodes, with_link_layers

    w = FakeWorld(_replan_job(on_preemption), with_link_layers(default_nodes()))
    w.step()
    w.set_phase("Running")
    w.step()
    return w, lambda: Layout.from_json(w.configmap["data"][child_names.LAYOUT_FILE])


def test_reconcile_replans_once_from_a_checkpoint_and_not_against_backoff_limit():
    w, layout_now = _world()
    before = layout_now()
    slow = max(before.stages, key=lambda s: s.num_layers).island  # the island with the most layers
    speed = {s.island: 0.5 if s.island == slow else 0.05 for s in before.stages}
    w.step(progress=_progress(before, speed, 10, 10))  # measured: judged, re-planned
    assert w.status["phase"] == "Restarting" and w.condition("Reconciling")["reason"] == "Replanned"
    assert w.status["restartsByReason"] == {"replan": 1} and w.condition("Replanned")["status"] == "True"
    ev = next(e for e in w.events if e.reason == "Replanned")
    assert "estimated" in ev.message and slow in ev.message
    adaptation = w.status["adaptation"]
    assert adaptation["replans"] == 1 and set(adaptation["measuredTflops"]) == set(before.nodes)
    assert "stages" not in w.status["progress"]  # measured in the layout left behind
    w.step()  # relaunch in the new layout, priced at the measured rates
    after = layout_now()
    assert w.status["launched"] and replan.signature(after) != replan.signature(before)
    layers_on = {s.island: s.num_layers for s in after.stages}
    assert layers_on[slow] < max(s.num_layers for s in before.stages)  # the slow island gave layers away
    w.set_phase("Running")
    w.step()
    for it in (20, 30, 40):  # the same real speeds in the new layout: no second re-plan
        w.step(progress=_progress(after, speed, it, it))
        assert w.status["phase"] == "Running", w.condition("Replanned")
    assert w.condition("Replanned")["reason"] == "PlanHolds" and w.status["adaptation"]["replans"] == 1
    assert w.status["restartsByReason"] == {"replan": 1}  # backoffLimit 0 untouched


def test_without_a_stop_checkpoint_the_replan_waits_for_the_next_periodic_one():
    w, layout_now = _world(on_preemption=False)
    before = layout_now()
    slow = max(before.stages, key=lambda s: s.num_layers).island
    speed = {s.island: 0.5 if s.island == slow else 0.05 for s in before.stages}
    w.step(progress=_progress(before, speed, 12, 10))
    assert w.status["phase"] == "Running" and w.status["adaptation"]["pendingAfterCheckpoint"] == 10
    assert any(e.reason == "Replanned" for e in w.events)
    w.step(progress=_progress(before, speed, 14, 10))
    assert w.status["phase"] == "Running"
    w.step(progress=_progress(before, speed, 15, 15))
    assert w.status["phase"] == "Restarting" and w.condition("Reconciling")["reason"] == "Replanned"
    assert "checkpoint at iteration 15" in w.condition("Reconciling")["message"]
    assert "pendingAfterCheckpoint" not in w.status["adaptation"]


def test_rates_of_nodes_not_measured_again_are_kept(layout):
    first = judge(layout, progress_for(layout, slow={H100: 3.0}))
    state = replan.adapted({"measuredTflops": {"elsewhere": 1.5}}, first, layout)
    assert state["measuredTflops"]["elsewhere"] == 1.5 and set(layout.nodes) <= set(state["measuredTflops"])
