"""Per-stage measured times at rank 0 (stage_times.py): carried on the existing all-reduce, in the
iteration lines and as gauges the operator's progress reader parses."""

import io
import json
import time
import urllib.request

import pytest
import torch

from holmes.operator.progress import from_prometheus
from holmes.trainer.engine import Trainer
from holmes.trainer.reporting import MetricsSink
from holmes.trainer.stage_times import WARMUP, StageTimes
from tests.helpers.trainer.trainer_harness import make_layout, run_ranks, tiny_config

DELAY = 0.25  # seconds of real extra time per forward of the slowed stage: far above the noise


def _slowed(rank, cfg, layout, slow_stage):
    stream = io.StringIO()
    sink = MetricsSink(enabled=rank == 0, port=0 if rank == 0 else None, addr="127.0.0.1", stream=stream)
    trainer = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo", sink=sink)
    if trainer.info.stage == slow_stage:  # a genuinely slower stage: every forward takes longer
        # (sleeping, not spinning: on a shared 2-core machine a spin would slow the other stage too)
        trainer.module.register_forward_pre_hook(lambda _m, _i: time.sleep(DELAY))
    trainer.train()
    scraped = ""
    if rank == 0:
        with urllib.request.urlopen(f"http://127.0.0.1:{sink.port}/metrics", timeout=5) as r:
            scraped = r.read().decode()
    sink.close()
    return {"lines": stream.getvalue(), "scraped": scraped, "summary": trainer.stage_times.summary()}


def test_a_slow_stage_shows_in_rank_0s_stage_times_and_gauges():
    cfg = tiny_config(iterations=WARMUP + 3, global_batch_size=8)
    layout = make_layout(2, 1, [2, 2], 2, 4)
    res = run_ranks(2, _slowed, cfg, layout, 1)
    out = res[0][1]
    lines = [json.loads(x) for x in out["lines"].splitlines()]
    start = next(x for x in lines if x["holmes"] == "start")
    assert start["layout"]["nodes"] == list(layout.nodes) and start["layout"]["stageLayers"] == [
        [0, 2],
        [2, 4],
    ]
    its = [x for x in lines if x["holmes"] == "iteration"]
    assert "stages" not in its[0]  # iteration 1 carries nothing: measured times travel one late
    for it in its[1:]:
        s0, s1 = it["stages"]
        assert (s0["stage"], s0["layers"], s1["stage"], s1["layers"]) == (0, 2, 1, 2)
        # 4 micro-batches x DELAY more on stage 1 (the stages are otherwise alike but for the head)
        assert s1["computeSeconds"] - s0["computeSeconds"] > 0.8 * 4 * DELAY
        assert s1["layerSeconds"] == pytest.approx(s1["computeSeconds"] / (4 * 2), rel=1e-3)
        assert s0["p2pWaitSeconds"] > s1["p2pWaitSeconds"]  # stage 0 waits on the slow stage
    summary = out["summary"]
    assert [r["samples"] for r in summary] == [len(its) - 1 - WARMUP] * 2
    parsed = from_prometheus(out["scraped"])
    assert [(r["stage"], r["layers"], r["samples"]) for r in parsed["stages"]] == [
        (r["stage"], r["layers"], r["samples"]) for r in summary
    ]
    assert parsed["stages"][1]["computeSeconds"] == pytest.approx(summary[1]["computeSeconds"], rel=1e-5)


def test_stage_slots_sum_to_each_stages_mean_over_its_ranks():
    times = [StageTimes([3, 1], stage=s, ranks_per_stage=2, micro_batches=4, warmup=0) for s in (0, 0, 1, 1)]
    assert times[0].incoming([0.0] * 6) is None  # the first iteration: nothing measured yet
    for t, c in zip(times, (1.0, 3.0, 4.0, 6.0)):
        t.record(c, 0.5, 0.25)
    summed = [sum(v) for v in zip(*(t.outgoing() for t in times))]
    rows = times[0].incoming(summed)
    assert [r["computeSeconds"] for r in rows] == [2.0, 5.0]
    assert [r["layerSeconds"] for r in rows] == pytest.approx([2.0 / 12, 5.0 / 4], abs=1e-6)
    assert times[0].summary()[1]["samples"] == 1
