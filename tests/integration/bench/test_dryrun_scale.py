"""bench/dryrun_scale.py's small mode: plan a 4-layer job on 4 nodes, dry-run every stage, print
the planner-vs-dry-run table; every check passes."""

import json

import pytest

from tests.helpers.bench.bench_run import run_bench

pytestmark = pytest.mark.cpu_torch  # the dry run's fake CUDA device (tests/conftest.py)


def test_small_mode_plans_dry_runs_and_reports(tmp_path):
    out = tmp_path / "dry.json"
    p = run_bench("dryrun_scale", "--small", "--out", str(out), timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert "planner GiB" in p.stdout and "sequences match: True" in p.stdout
    rec = json.loads(out.read_text())["small"]
    stages = rec["dryRun"]["stages"]
    assert len(stages) == rec["layout"]["pipeline"] == 2
    assert all(s["dryRunPeakGiB"] > 0 and "plannedGiB" in s for s in stages)
    assert rec["cpuSeconds"] > 0 and rec["wallSeconds"] > 0
