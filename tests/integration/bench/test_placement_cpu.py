"""bench/placement_cpu.py (issue 46): the operator's CPU per launch and per running job's
reconcile on the real pipeline, and side by side with another checkout."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.bench.bench_run import run_bench

REPO = Path(__file__).resolve().parents[3]


def test_small_mode_launches_every_job_and_times_both_side_by_side():
    p = run_bench("placement_cpu", "--small", "--against", str(REPO))  # this checkout twice
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    mine = out[str(REPO)]
    assert mine["launched"] == 8 and mine["launchCpuMs"] > 0 and mine["reconcileCpuMs"] > 0, out
    assert set(out["ratio"]) == {"launchCpuMs", "reconcileCpuMs"}, out


def test_a_folder_that_is_no_checkout_is_refused_naming_it(tmp_path):
    p = run_bench("placement_cpu", "--small", "--against", str(tmp_path))
    assert p.returncode == 2 and f"--against {tmp_path}: not a Holmes checkout" in p.stderr
