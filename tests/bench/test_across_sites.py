"""bench/across_sites.py: its pure parts, and its small mode on the emulated fabric (root)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.bench.bench_run import BENCH, run_bench

sys.path.insert(0, str(BENCH))
import across_sites as bench  # noqa: E402


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
def test_small_mode_prints_both_picks_and_both_measured_bests():
    if os.geteuid() != 0:
        pytest.skip("root: network namespaces, tc and cgroups need root")
    import fabric_netns

    with fabric_netns.exclusive():
        problems = fabric_netns.missing_prerequisites()
    if problems:
        pytest.skip("; ".join(problems))
    p = run_bench("across_sites", "--smoke", timeout=580)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    last = json.loads(p.stdout.strip().splitlines()[-1])
    for key in ("plannerPickSlow", "plannerPickFast", "measuredBestSlow", "measuredBestFast"):
        assert last[key] in ("pipeline", "replicas", "none"), last
    assert "slowLinkTimeToLossRatio" in last and last["coresPerRank"] > 0
    assert "replicas H=" in p.stdout and "planner, slow link" in p.stdout
