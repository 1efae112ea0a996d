"""bench/plan_scaling.py side by side (issue 47): the same case under two interpreters, runs
alternating, and a run whose layouts differ fails."""

from __future__ import annotations

import json
import sys

from tests.helpers.bench.bench_run import run_bench


def test_side_by_side_times_both_and_finds_the_same_layout():
    p = run_bench(
        "plan_scaling", "--nodes", "64", "--cluster", "96", "--repeat", "2", "--against", sys.executable
    )
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    rows = [line.split() for line in p.stdout.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert len(rows) == 2 and all(float(r[1]) > 0 and float(r[2]) > 0 for r in rows), p.stdout
    assert "64 of 96 nodes: median" in p.stdout
    assert "same layout: yes (1x32x16" in p.stdout, p.stdout


def test_a_different_layout_fails_the_run(tmp_path):
    other = tmp_path / "other-python"
    answer = {"seconds": 1.0, "layout": "0" * 64, "shape": "1x1x512", "kib": 1.0, "tflopsPerGpu": 1.0}
    other.write_text(f"#!/bin/sh\necho '{json.dumps(answer)}'\n")
    other.chmod(0o755)
    p = run_bench("plan_scaling", "--nodes", "64", "--repeat", "1", "--against", str(other))
    assert p.returncode == 1, p.stdout + p.stderr[-3000:]
    assert "same layout: NO" in p.stdout


def test_a_cluster_smaller_than_the_job_is_refused_naming_the_fix():
    p = run_bench("plan_scaling", "--nodes", "128", "--cluster", "64")
    assert p.returncode == 2
    assert "--cluster 64 has fewer nodes than the job's 128: raise --cluster" in p.stderr
