"""The short version of bench/operator_load.py: 2 steady jobs on 4 hollow nodes (``playedBy:
kwok``; the hollow_bench_cluster fixture's), 15 s windows, a 5 s progress interval.
The operator's requests per running job must come out near one status patch per progress
interval (0.2/s): an operator that polled or patched on every pass would show several times
that."""

from __future__ import annotations

import re

from tests.helpers.bench.bench_run import run_bench


def test_steady_jobs_cost_one_patch_per_progress_interval(hollow_bench_cluster):
    proc = run_bench(
        "operator_load",
        "--jobs=2",
        "--window=15",
        "--progress-interval=5",
        "--apply-nodes=0",
        env={"HOLMES_KUBECONFIG": hollow_bench_cluster},
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode in (0, 1), out  # 1: the 0.1 target, which a 5 s interval cannot meet
    per_job = re.search(r"per running job\s+(-?[0-9.]+)\s+(-?[0-9.]+)", out)
    assert per_job, out
    operator = float(per_job.group(2))
    assert 0.1 <= operator <= 0.35, out
    assert re.search(r"PATCH holmesjobs/status\s+\+0\.[1-5]", out), out
    assert "operator: CPU" in out
