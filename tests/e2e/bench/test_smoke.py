"""The bench scripts that need the local control plane, in their small modes (the others, and the
check that every script has a small-mode test: tests/integration/bench/test_smoke.py)."""

from __future__ import annotations

import re

import pytest

from tests.helpers.bench.bench_run import run_bench


@pytest.mark.timeout(600)
def test_operator_apply_small_mode(hollow_bench_cluster):  # its 8 hollow nodes (playedBy: kwok)
    p = run_bench(
        "operator_apply", "--sizes", "8", "--repeats", "1", env={"HOLMES_KUBECONFIG": hollow_bench_cluster}
    )
    out = p.stdout + p.stderr[-3000:]
    assert p.returncode == 0, out
    assert re.search(r"^\s+8\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+", p.stdout, re.M), out


@pytest.mark.timeout(600)
def test_shared_queue_small_mode_never_holds_a_gpu_twice(cluster):
    p = run_bench(
        "shared_queue",
        "--jobs",
        "3",
        "--scale",
        "0.1",
        env={"HOLMES_KUBECONFIG": cluster.kubeconfig},
        timeout=500,
    )
    out = p.stdout + p.stderr[-3000:]
    assert p.returncode in (0, 1), out  # 1: the makespan target, which 2-4 s jobs cannot meet
    row = re.search(r"^\s+3\s+6\s+\d+\s+[0-9.]+\s+[0-9.]+\s+[0-9.]+\s+(\d+)\s+(\d+)\s", p.stdout, re.M)
    assert row, out
    assert int(row.group(1)) <= 2 and int(row.group(2)) == 0, out  # max GPUs per node, oversubscribed
    assert p.stdout.rstrip().endswith("met") or "failed [], unfinished []" in out, out
