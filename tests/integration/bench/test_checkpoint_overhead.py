"""bench/checkpoint_overhead.py's small mode: every case runs, each rank under its CPU budget,
and the last line is the JSON the table in docs/benchmarks.md comes from."""

import json
import os

import pytest

from tests.helpers.bench.bench_run import run_bench


def test_small_mode_measures_both_saves_side_by_side():
    import cpu_limit

    if os.geteuid() != 0:
        pytest.skip("root: the per-rank CPU budgets are cgroups")
    try:
        cpu_limit.detect()
    except cpu_limit.CpuLimitError as e:
        pytest.skip(str(e))
    p = run_bench("checkpoint_overhead", "--smoke", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert {"asyncOverhead", "syncOverhead"} <= set(result)
    assert result["coresPerRank"] == 0.5 and result["stagedBytesPerRank"] > 0
    assert "async" in p.stdout and "sync" in p.stdout
