"""bench/across_sites.py: its pure parts, and its small mode on the emulated fabric (root)."""

from __future__ import annotations

import json

import across_sites as bench  # bench/ is on pytest's pythonpath
import pytest

from tests.helpers.bench.bench_run import run_bench


def test_the_corpus_has_structure_a_model_can_learn():
    toks = bench.corpus(20_000, 64, noise=0.1)
    successors: dict[int, set[int]] = {}
    for a, b in zip(toks[:-1], toks[1:]):
        successors.setdefault(int(a), set()).add(int(b))
    # without noise each token has at most two successors; the noise adds a few more
    common = sorted(len(s) for s in successors.values())
    assert common[len(common) // 2] < 64 // 2, common


def test_the_time_to_the_target_is_the_slowest_replicas_sum_until_the_smoothed_loss_reaches_it():
    a = [{"loss": x, "iterationSeconds": 1.0} for x in (5, 4, 3, 2, 1)]
    b = [{"loss": x, "iterationSeconds": 2.0} for x in (5, 4, 3, 2, 1)]
    assert bench.to_target([a], 3.0, 1) == (3, 3.0)
    assert bench.to_target([a, b], 3.0, 1) == (3, 6.0)  # the replicas meet: the slower sets the pace
    assert bench.to_target([a], 3.0, 2) == (4, 4.0)  # (3 + 2) / 2 is the first smoothed value <= 3
    assert bench.to_target([a], 0.5, 1) is None


def test_the_pipeline_layout_puts_one_stage_on_each_island():
    lay = bench.layout(("node-1", "node-2"), 4, 2, 8)
    assert [s.layers for s in lay.stages] == [(0, 2), (2, 4)] and lay.world_size == 2
    one = bench.layout(("node-2",), 4, 2, 4)
    assert one.pipeline == 1 and one.micro_batches == 4


def test_replicas_get_the_outer_step_settings_and_half_the_batch_each():
    a = bench.build_parser().parse_args([])
    job = bench.job_manifest(a, "/c.bin", "replicas", 5, a.batch // 2, 3e-3)
    t = job["spec"]["training"]
    assert t["globalBatchSize"] == a.batch // 2 and t["acrossIslands"]["innerSteps"] == 5
    assert t["learningRate"] == 3e-3 and t["minLearningRate"] == pytest.approx(3e-4)
    assert (
        "acrossIslands"
        not in bench.job_manifest(a, "/c.bin", "pipeline", 0, a.batch, 1e-3)["spec"]["training"]
    )


def test_each_case_runs_at_the_learning_rate_that_reached_the_target_in_fewest_tokens():
    reached = {
        ("pipeline", 1e-3): (60, 9.0),
        ("pipeline", 3e-3): (40, 6.0),
        ("pipeline", 1e-2): (40, 5.0),  # a tie in tokens: the lower learning rate
        ("replicas H=5", 1e-3): None,
        ("replicas H=5", 1e-2): (50, 4.0),
        ("replicas H=20", 1e-3): None,  # never reached it: left out, not guessed
    }
    assert bench.best_lrs(reached) == {"pipeline": 3e-3, "replicas H=5": 1e-2}


def test_the_planner_is_calibrated_on_replica_iterations_without_an_outer_step():
    its = [{"iterationSeconds": 9.0}] * 3  # warm-up, left out
    its += [{"iterationSeconds": 0.2}, {"iterationSeconds": 0.2}, {"iterationSeconds": 1.5, "outer": {}}]
    run = bench.Run("fast", "replicas", 5, 1e-3, curves=[its, its])
    assert (
        bench.replica_compute_s(
            [run, bench.Run("fast", "pipeline", curves=[[{"iterationSeconds": 5.0}] * 9])]
        )
        == 0.2
    )
    assert bench.steady_s(run) == pytest.approx((0.2 + 0.2 + 1.5) / 3)  # the exchange is a cost
    with pytest.raises(ValueError, match="--inner-steps"):
        bench.replica_compute_s([bench.Run("fast", "replicas", 1, curves=[its[:3] + its[-1:]])])


@pytest.mark.timeout(600)
def test_small_mode_prints_both_picks_and_both_measured_bests(fabric):
    p = run_bench("across_sites", "--smoke", timeout=580)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    last = json.loads(p.stdout.strip().splitlines()[-1])
    for key in ("plannerPickSlow", "plannerPickFast", "measuredBestSlow", "measuredBestFast"):
        assert last[key] in ("pipeline", "replicas", "none"), last
    assert "slowLinkTimeToLossRatio" in last and last["coresPerRank"] > 0
    link = last["slowLink"]  # 20 ms each way through the delay line, in its own CPU budget
    assert link["delayMs"] == 20 and 39 <= link["rttMs"] <= 60, link
    assert 0 < link["delayLineCores"] < 0.25, link
    assert "replicas H=" in p.stdout and "planner, slow link" in p.stdout


def curve(reach: int, seconds: float, outer_every: int = 0, outer_s: float = 0.0) -> list[dict]:
    """Loss 3.0 until iteration ``reach``, 1.7 from there; an outer step every ``outer_every``."""
    out = []
    for i in range(1, 61):
        line: dict = {"loss": 1.7 if i >= reach else 3.0, "iterationSeconds": seconds}
        if outer_every and i % outer_every == 0:
            line.update(outer={}, iterationSeconds=seconds + outer_s)
        out.append(line)
    return out


def test_the_summary_races_each_case_at_its_best_rate_and_finds_the_crossover_at_the_slow_links_h():
    a = bench.build_parser().parse_args(
        ["--smooth", "1", "--lrs", "1e-3", "2e-3", "--inner-steps", "5", "20"]
    )
    P, R = "pipeline", "replicas"
    runs = [
        bench.Run("fast", P, 0, 1e-3, curves=[curve(40, 0.14)]),
        bench.Run("fast", P, 0, 2e-3, curves=[curve(32, 0.14)]),
        bench.Run("fast", R, 5, 1e-3, curves=[curve(51, 0.11, 5, 0.01)] * 2),
        bench.Run("fast", R, 5, 2e-3, curves=[curve(58, 0.11, 5, 0.01)] * 2),
        bench.Run("fast", R, 20, 1e-3, curves=[curve(59, 0.11, 20, 0.01)] * 2),
        bench.Run("fast", R, 20, 2e-3, curves=[curve(51, 0.11, 20, 0.01)] * 2),
        bench.Run("slow", P, 0, 2e-3, curves=[curve(32, 1.47)]),
        bench.Run("slow", R, 5, 1e-3, curves=[curve(51, 0.11, 5, 9.3)] * 2),
        bench.Run("slow", R, 20, 2e-3, curves=[curve(51, 0.11, 20, 9.3)] * 2),
    ]
    out = bench.summarize(a, runs)
    assert out["bestLearningRate"] == {"pipeline": 2e-3, "replicas H=5": 1e-3, "replicas H=20": 2e-3}
    assert out["tokensRatio"] == {"5": 1.594, "20": 1.594}
    assert out["measuredBestFast"] == "pipeline" and out["measuredBestSlow"] == "replicas"
    assert out["plannerPickFast"] == "pipeline" and out["plannerPickSlow"] == "replicas"
    assert out["replicaComputeMs"] == 110.0
    # at H=20, the slow link's pick: at H=5 (as few tokens, its exchange 4x as often) the pipeline
    # wins at both ends of the range and no crossover is found
    assert out["crossoverInnerSteps"] == 20 and 3 < out["predictedCrossoverMbit"] < 5000
    # at the slow link's 20 ms 1F1B's loop (2 micro-batches in flight, each activation sent once
    # the last stage asked) pays two latencies per micro-batch, 320 ms per iteration, which
    # outlasts a replica's 110 ms of compute times 1.59 (175 ms) at any bandwidth: no crossover
    assert a.slow_delay_ms == 20 and out["predictedCrossoverMbitAtSlowDelay"] is None
    zero = bench.build_parser().parse_args(
        ["--smooth", "1", "--lrs", "1e-3", "2e-3", "--inner-steps", "5", "20", "--slow-delay-ms", "0"]
    )
    assert bench.summarize(zero, runs)["predictedCrossoverMbitAtSlowDelay"] == out["predictedCrossoverMbit"]


def test_the_slow_pipeline_is_predicted_at_the_shaped_links_rate_whatever_its_delay():
    """The emulated slow link is tbf with a 256 KiB bucket: 1F1B's loop idles the link, the bucket
    refills meanwhile, so iteration after iteration the link carries M = 8 activations of 64 KiB
    each way at 3 Mbit/s (1398 ms) and the 20 ms delay hides: measured 1503 ms with the delay and
    1475 without (docs/benchmarks.md), where the closed form predicted 1963 and 1760."""
    a = bench.build_parser().parse_args([])
    rate_bound = 8 * a.micro_batch * a.seq * a.hidden * 4 * 8 / (a.slow_mbit * 1e6)
    for delay_ms in (20.0, 0.0):
        a.slow_delay_ms = delay_ms
        run = bench.Run("slow", "pipeline")
        predicted = bench.predicted_s(bench.planner_inputs(a, 0.121), bench.emulated_links(a)["slow"], run)
        assert predicted == pytest.approx(rate_bound, rel=1e-3)


@pytest.mark.timeout(600)
def test_the_link_check_measures_the_pipeline_on_a_line_and_prints_the_simulation_beside_it(fabric):
    p = run_bench("across_sites", "--smoke", "--link-check", "--shapers", "line", timeout=580)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    last = json.loads(p.stdout.strip().splitlines()[-1])
    cases = last["cases"]
    assert [(c["shaper"], c["delayMs"]) for c in cases] == [("line", 0.0), ("line", 20.0)]
    assert all(c["measuredMs"] > 0 and c["predictedMs"] > 0 and c["burstBytes"] == 3028 for c in cases)
