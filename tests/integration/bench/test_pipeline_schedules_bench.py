"""bench/pipeline_schedules.py's small mode: every schedule runs on the same three-island layout (or
is shown with the planner's reason it cannot),
each rank under its CPU budget, every one matches the single-process reference, and the last line
is the JSON the table in docs/benchmarks.md comes from (its speeds mean nothing at toy width)."""

import json
import os

import pytest

from tests.helpers.bench.bench_run import run_bench

SCHEDULES = {"1F1B", "Interleaved1F1B", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV"}


def test_small_mode_runs_every_schedule_side_by_side_at_parity():
    import cpu_limit

    if os.geteuid() != 0:
        pytest.skip("root: the per-rank CPU budgets are cgroups")
    try:
        cpu_limit.detect()
    except cpu_limit.CpuLimitError as e:
        pytest.skip(str(e))
    p = run_bench("pipeline_schedules", "--smoke", timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    result = json.loads(p.stdout.strip().splitlines()[-1])
    ran, refused = set(result["tokensPerSecond"]), result["notRunnable"]
    assert ran | set(refused) == SCHEDULES and not ran & set(refused)
    assert set(result["bubbleSeconds"]) == ran  # measured, beside the planned column
    assert result["islands"] == 3 and result["pipeline"] >= 3
    # M = P: 1F1B's bubble is 40% of its iteration, too few micro-batches for DualPipeV (said why)
    assert set(refused) == {"DualPipeV"}
    assert "microBatches (3) >= 2 x pipeline stages (6)" in refused["DualPipeV"]
    assert result["plannerPick"] in SCHEDULES and result["measuredBest"] in SCHEDULES
    assert result["bestNewSchedule"] in SCHEDULES - {"1F1B"} and result["speedupOver1F1B"] > 0
    assert result["worstParityRelDiff"] < 1e-4
    assert result["coresPerRank"] == 0.3 and "lends no CPU" in p.stdout
    # the planner priced with what was measured here: per message, per action, a split backward
    assert result["pipelineActionSeconds"] > 0 and result["splitBackwardRatio"] > 0
    assert "ms per schedule action" in p.stdout


def test_the_message_costs_mode_measures_two_messages_and_simulates_every_schedule():
    p = run_bench("pipeline_schedules", "--message-costs", "--no-cpu-limit", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert result["messageSeconds"] > 0 and result["activationMessageSeconds"] > 0
    assert set(result["simulatedIdleSeconds"]) == {
        "1F1B",
        "Interleaved1F1B",
        "InterleavedZeroBubble",
        "ZBVZeroBubble",
    }
    assert result["coresPerRank"] is None and "per message between two ranks" in p.stdout
