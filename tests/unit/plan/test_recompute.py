"""Activation recomputation: the job's setting drives the planner's time, memory and TFLOPS formula."""

import pytest

from holmes.contract import JobSpec, ModelCost, flops
from holmes.plan import CostModelConfig, PlanError, plan
from holmes.plan.costmodel import Shape, StageCost, StagePlace
from tests.helpers.plan.plan_helpers import job_spec, paper_nodes

SHAPES = [  # (layers, hidden, heads, seq, vocab)
    (36, 4096, 32, 2048, 50257),  # the paper's GPT 7.4B
    (30, 3072, 24, 2048, 50257),  # GPT 3.6B
    (4, 32, 4, 16, 64),  # the trainer tests' tiny model
    (6, 64, 4, 32, 256),  # the demo
]


def with_recompute(spec, on):
    spec["training"]["activationRecompute"] = on
    return spec


def model_of(layers, hidden, heads, seq, vocab):
    return ModelCost.of(
        JobSpec.from_spec(
            job_spec(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, B=64, mb=1)
        ).model
    )


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("recompute", [True, False])
def test_closed_form_formulas_match_the_cost_models_flop_counts(shape, recompute):
    layers, hidden, heads, seq, vocab = shape
    m = model_of(*shape)
    B, mb = 96, 2
    closed = flops.paper_formula(
        global_batch=B, seq=seq, layers=layers, hidden=hidden, vocab=vocab, recompute=recompute
    )
    assert m.flops_per_iteration(B, recompute=recompute) == pytest.approx(closed, rel=1e-12)
    # ... and with the FLOPs the time model charges: one stage holding the whole model, T = D = 1,
    # so compute seconds x the GPU's rate is every FLOP of the iteration.
    cfg = CostModelConfig(activation_recompute=recompute)
    cost = StageCost(
        m,
        Shape(tensor=1, data=1, pipeline=1, micro_batch=mb, micro_batches=B // mb),
        StagePlace(0, True, True, None, 0.0, 0.0, 1),
        cfg,
    )
    charged = (B // mb) * (cost.fwd(layers) + cost.bwd(layers)) * cfg.flops_per_second
    assert charged == pytest.approx(closed, rel=1e-12)


def test_the_two_formulas_differ_by_the_recomputed_layer_forward():
    s, l, h, V = 2048, 36, 4096, 50257
    on = flops.paper_formula(global_batch=96, seq=s, layers=l, hidden=h, vocab=V, recompute=True)
    off = flops.paper_formula(global_batch=96, seq=s, layers=l, hidden=h, vocab=V, recompute=False)
    assert on / (1.0 * 64 * 1e12) == pytest.approx(196.8, abs=0.05)  # design §1: 96 samples/s, 64 GPUs
    assert on - off == pytest.approx(
        96 * s * l * 24 * h * h * (1 + s / (6 * h))
    )  # one layer forward per token
    assert 72 / 96 < off / on < 1  # the head is not recomputed
    assert flops.formula_name(True).startswith("96") and flops.formula_name(False).startswith("72")


def fixed_paper_job(on, **kw):
    # fixed degrees: the same layout both ways, so only recomputation differs
    return with_recompute(job_spec(tensor=1, pipeline=2, data=32, partition="uniform", mb=1, **kw), on)


def test_recompute_off_is_faster_and_needs_more_memory():
    on = plan(paper_nodes(), fixed_paper_job(True))
    off = plan(paper_nodes(), fixed_paper_job(False))
    assert (on.pipeline, on.data) == (off.pipeline, off.data) == (2, 32)
    eon, eoff = on.estimate, off.estimate
    assert eon["activationRecompute"] is True and eoff["activationRecompute"] is False
    assert eoff["iterationSeconds"] < eon["iterationSeconds"]
    assert eoff["memoryPerGpuGiB"] > eon["memoryPerGpuGiB"]
    for s_on, s_off in zip(eon["stages"], eoff["stages"]):
        assert s_off["computeSeconds"] < s_on["computeSeconds"] and s_off["memoryGiB"] > s_on["memoryGiB"]
    # each estimate counts the FLOPs of what runs: 96 vs 72 formula
    assert eon["flopsPerIteration"] == pytest.approx(
        flops.paper_formula(global_batch=2048, seq=2048, layers=36, hidden=4096, vocab=50257, recompute=True),
        rel=1e-5,
    )
    assert eoff["flopsPerIteration"] == pytest.approx(
        flops.paper_formula(
            global_batch=2048, seq=2048, layers=36, hidden=4096, vocab=50257, recompute=False
        ),
        rel=1e-5,
    )
    for e in (eon, eoff):
        assert e["tflopsPerGpu"] == pytest.approx(
            e["flopsPerIteration"] / (e["iterationSeconds"] * 64e12), rel=1e-4
        )


def test_the_job_wins_over_the_planner_config_fallback():
    for on in (True, False):
        a = plan(paper_nodes(), fixed_paper_job(on), CostModelConfig(activation_recompute=True))
        b = plan(paper_nodes(), fixed_paper_job(on), CostModelConfig(activation_recompute=False))
        assert a.estimate == b.estimate and a.estimate["activationRecompute"] is on


def test_a_model_that_only_fits_with_recompute_says_so():
    # 7.4B on one stage (pipeline 1, data 64): with recomputation ~50 GiB per GPU; without it every
    # layer keeps its full working set per micro-batch (36 x 3.6 GiB at mb 4)
    spec = dict(tensor=1, pipeline=1, data=64)
    fits = plan(paper_nodes(), with_recompute(job_spec(**spec), True))
    assert fits.estimate["memoryPerGpuGiB"] < 72
    with pytest.raises(PlanError, match="activationRecompute: true"):
        plan(paper_nodes(), with_recompute(job_spec(**spec), False))
    # with auto degrees the planner finds a layout that fits without recomputation
    auto = plan(paper_nodes(), with_recompute(job_spec(), False))
    assert auto.estimate["memoryPerGpuGiB"] < 72 and auto.estimate["activationRecompute"] is False


def test_the_explanation_says_whether_it_assumed_recompute():
    assert "activation recompute off" in "\n".join(plan(paper_nodes(), fixed_paper_job(False)).explanation)
    assert "activation recompute on" in "\n".join(plan(paper_nodes(), fixed_paper_job(True)).explanation)
