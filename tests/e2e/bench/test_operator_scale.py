"""The small mode of bench/operator_scale.py on a private cluster it starts with its topology of
40 hollow nodes (``playedBy: kwok``) in 4 islands: 8 HolmesJobs over a 4 s ramp, one of each
churn (a job deleted, a spec edited, a pod failed, a node NotReady and back, three bad specs).
Its numbers mean little at this size; what must hold is that nothing is orphaned, doubled or
lost and every job ends in the phase it should, and that the figures the issue asks for are all
there and measured (a launch, reconciles, the operator's own requests with a progress patch per
interval, its memory)."""

from __future__ import annotations

import json

from tests.helpers.bench.bench_run import run_bench

KEYS = (
    "nodes",
    "nodesReadyS",
    "jobs",
    "launchP50S",
    "launchP99S",
    "reconcileP99S",
    "apiRequestsPerSecondPerJob",
    "operatorRssMiB",
    "operatorCpuSeconds",
    "orphanPods",
    "duplicatePods",
    "lostJobs",
    "wrongPhase",
)


def test_small_scale_run_loses_and_doubles_nothing():
    # not the session's cluster: the bench's own, whose kwok plays its nodes
    proc = run_bench("operator_scale", "--small", env={"HOLMES_KUBECONFIG": ""}, timeout=400)
    out = proc.stdout + proc.stderr[-4000:]
    assert proc.returncode == 0, out
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(KEYS) <= set(res), out
    assert (res["nodes"], res["jobs"]) == (40, 8) and res["nodesReadyS"] > 0
    assert res["orphanPods"] == res["duplicatePods"] == res["lostJobs"] == res["wrongPhase"] == 0, out
    assert all(v >= 1 for v in res["churn"].values()), res["churn"]
    assert 0 < res["launchP50S"] <= res["launchP99S"], out
    assert 0 < res["reconcileP99S"] and res["operatorRssMiB"] > 0, out
    # running jobs cost the operator a status patch per progress interval (10 s), no more
    assert 0.03 <= res["apiRequestsPerSecondPerJob"] <= 0.2, out
    assert res["operatorRequestsBy"].get("POST pods", 0) >= res["jobs"], out
