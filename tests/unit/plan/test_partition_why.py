"""The 'why' lines on the partition come from the cost model's numbers, on several topologies."""

import pytest

from holmes.plan import CostModelConfig, plan
from holmes.plan.costmodel import estimate_pipeline, iteration_seconds
from holmes.plan.partition_why import _s, breakdown, move, partition_lines
from holmes.plan.planner import as_job, search, select_nodes
from tests.helpers.plan.plan_helpers import job_spec, node, paper_nodes


def best_of(nodes, spec, cfg=None):
    cfg = cfg or CostModelConfig()
    job = as_job(spec)
    best, _ = search(select_nodes(nodes, job, cfg), job, cfg)
    return best


def ib_eth():
    return [node(f"ib-{i}", "infiniband", "east") for i in range(4)] + [
        node(f"eth-{i}", "ethernet", "west") for i in range(4)
    ]


def three_islands():
    return (
        [node(f"ib-{i}", "infiniband", "east") for i in range(2)]
        + [node(f"roce-{i}", "roce", "west") for i in range(2)]
        + [node(f"eth-{i}", "ethernet", "south") for i in range(2)]
    )


def why(layout):
    return layout.explanation[layout.explanation.index("why:") + 1 :]


@pytest.mark.parametrize(
    "nodes, spec",
    [
        (paper_nodes(), job_spec()),
        (ib_eth(), job_spec(pipeline=2)),
        (three_islands(), job_spec(count=6, B=1536, pipeline=3)),
        (paper_nodes(), job_spec(pipeline=4)),
        ([node(f"n{i}", "infiniband", "east") for i in range(8)], job_spec(pipeline=8)),
    ],
)
def test_breakdown_adds_up_to_the_cost_models_estimate(nodes, spec):
    c = best_of(nodes, spec)
    b = breakdown(c.costs, c.layers)
    seconds, stages = estimate_pipeline(c.costs, c.layers)
    assert b.seconds == pytest.approx(seconds) and b.pipeline + b.tail == pytest.approx(seconds)
    assert b.steady + b.fill == pytest.approx(b.pipeline)
    assert b.step == pytest.approx(max(cc.step(n) for cc, n in zip(c.costs, c.layers)))
    # the hiding window of stage s is the backward drain of the stages before it
    drain = 0.0
    for s, (cc, n) in enumerate(zip(c.costs, c.layers)):
        assert b.window[s] == pytest.approx(drain, abs=1e-12)
        assert stages[s].finish == pytest.approx(b.pipeline - b.window[s] + b.exposed[s])
        drain += cc.bwd(n) + cc.place.p2p_out
    assert max(stages, key=lambda e: e.finish).index == b.tail_stage


def test_ib_plus_ethernet_gives_the_slow_dp_stage_fewer_layers_and_says_why():
    nodes, spec = ib_eth(), job_spec(pipeline=2)
    lay = plan(nodes, spec)
    c = best_of(nodes, spec)
    assert c.layers == (19, 17) and [s.nic for s in lay.stages] == ["infiniband", "ethernet"]
    lines = why(lay)
    line = next(x for x in lines if x.startswith("- stage 1 on west/ethernet gets 17 of 36 layers"))
    assert "stage 0 on east/infiniband 19: its DP communication is" in line and "x slower per layer" in line
    ratio = float(line.split("communication is ")[1].split("x")[0])
    per_layer = [sum(cc.dp_times(n + 1)) - sum(cc.dp_times(n)) for cc, n in zip(c.costs, c.layers)]
    assert ratio == pytest.approx(per_layer[1] / per_layer[0], rel=0.05) and ratio > 5
    # the sub-points are the two single-layer moves, each slower than the chosen partition
    cur = iteration_seconds(c.costs, c.layers)
    for parts, src, dst in (((20, 16), 1, 0), ((18, 18), 0, 1)):
        t = iteration_seconds(c.costs, parts)
        assert t > cur
        sub = next(x for x in lines if x.startswith(f"  - one layer from stage {src} to stage {dst}"))
        assert f"({parts[0]}/{parts[1]})" in sub and sub.endswith(f"{_s(t)}, +{_s(t - cur)}")
    u = iteration_seconds(c.costs, (18, 18))
    assert any(f"uniform split (18/18): {_s(u)} (+{_s(u - cur)}" in x for x in lines)
    bound = next(x for x in lines if x.startswith("- iteration "))
    assert "stage 1 (west/ethernet) finishes last" in bound and "exposed DP" in bound


def test_paper_topology_explains_the_equal_split():
    lay = plan(paper_nodes(), job_spec())
    c = best_of(paper_nodes(), job_spec())
    assert c.layers == (18, 18) and [s.nic for s in lay.stages] == ["infiniband", "roce"]
    lines = why(lay)
    line = next(x for x in lines if x.startswith("- stage 1 on west/roce gets 18 of 36 layers"))
    assert "as many as stage 0 on east/infiniband, although its DP communication is" in line
    assert "moving one of its layers to stage 0 costs more than it saves" in line
    # the trade, in the model's numbers: more steady-state time than the DP tail it saves
    cur = breakdown(c.costs, c.layers)
    mv = move(c.costs, c.layers, 1, 0).after
    steady, tail = mv.steady - cur.steady, mv.tail - cur.tail
    assert steady > 0 > tail and steady > -tail
    assert (
        mv.step_stage == 0 and cur.tail_stage == 1 and cur.window[1] > 0
    )  # RoCE hides part behind the drain
    sub = next(x for x in lines if x.startswith("  - one layer from stage 1 to stage 0 (19/17)"))
    assert f"steady state +{_s(steady)}" in sub and f"DP tail -{_s(-tail)}" in sub
    assert f"hiding window {_s(cur.window[1])}" in sub
    assert any(
        "this is the uniform split" in x and "next-best single-layer move: stage 1 -> 0 (19/17)" in x
        for x in lines
    )


def test_three_islands_and_long_pipelines():
    lay = plan(three_islands(), job_spec(count=6, B=1536, pipeline=3))
    lines = why(lay)
    eth = next(s for s in lay.stages if s.nic == "ethernet")
    ib = next(s for s in lay.stages if s.nic == "infiniband")
    assert eth.num_layers < ib.num_layers
    assert any(
        x.startswith(f"- stage {eth.index} on south/ethernet gets {eth.num_layers} of 36 layers")
        for x in lines
    )
    # middle stages pay p2p on both sides: the step line says so in layers' worth
    assert any("p2p in, p2p out" in x and "layers' worth" in x for x in lines)
    same = plan([node(f"n{i}", "infiniband", "east") for i in range(8)], job_spec(pipeline=8))
    assert any("DP fabrics are alike" in x for x in why(same))


def test_a_fixed_partition_names_the_faster_neighbour():
    lay = plan(ib_eth(), job_spec(pipeline=2, partition="uniform"))
    lines = why(lay)
    assert any(
        "a faster neighbour exists: one layer from stage 1 to stage 0 (19/17)" in x
        and "(the job fixes the partition)" in x
        for x in lines
    )


def test_single_stage_and_many_stages_stay_short_and_fast():
    nodes = [node(f"n{i}", "infiniband", "east") for i in range(8)]
    c = best_of(nodes, job_spec(pipeline=1, tensor=8, vocab=50304))
    lines = partition_lines(c.costs, c.layers, ["east/infiniband"], "adaptive")
    assert len(lines) == 1 and "micro-batches x" in lines[0]
    nodes = [node(f"n{i:02d}", "infiniband" if i % 2 else "roce", "a" if i % 2 else "b") for i in range(32)]
    lay = plan(nodes, job_spec(count=32, B=4096, pipeline=32, layers=96))
    text = "\n".join(why(lay))
    assert "partition adaptive " in text and len(text) < 6000
