"""Every script in bench/ runs in its small mode here, so a changed signature or a renamed field
fails `make test` instead of the next person who reproduces a number. Seconds each: toy models,
the fewest steps, the smallest sizes; what is checked is that the script runs to its table, not
its numbers. Scripts with a test file of their own are listed in OWN_TESTS; the last test fails
when a new script in bench/ has neither."""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import REPO
from tests.helpers.bench.bench_run import BENCH, run_bench

# imported or started by the scripts, run through them (delay_line: test_fabric_netns_delays_...)
LIBRARIES = {"trainer_common", "cpu_limit", "delay_line"}
OWN_TESTS = {  # script -> the test that runs its small mode
    "across_sites": "tests/integration/bench/test_across_sites.py",
    "outer_overlap": "tests/integration/bench/test_outer_overlap.py",
    "checkpoint_overhead": "tests/integration/bench/test_checkpoint_overhead.py",
    "dryrun_scale": "tests/integration/bench/test_dryrun_scale.py",
    "fault_soak": "tests/e2e/bench/test_fault_soak.py",
    "control_plane_faults": "tests/e2e/bench/test_control_plane_faults.py",
    "gpu": "tests/integration/bench/test_gpu_bench.py",
    "operator_load": "tests/e2e/bench/test_operator_load.py",
    "pipeline_schedules": "tests/integration/bench/test_pipeline_schedules_bench.py",
    "operator_scale": "tests/e2e/bench/test_operator_scale.py",
    "placement_cpu": "tests/integration/bench/test_placement_cpu.py",
}

# script -> (small-mode arguments, a line its output must contain)
PURE = {
    "plan_compare": ([], "4 IB + 4 RoCE (paper)"),
    "plan_scaling": (["--max-nodes", "64", "--repeat", "1"], "TFLOPS/GPU"),
    "stage_memory": (
        [
            "--layers",
            "2",
            "--hidden",
            "64",
            "--heads",
            "4",
            "--seq",
            "32",
            "--vocab",
            "256",
            "--stage-layers",
            "1",
        ],
        "build added",
    ),
    "trainer_microbatches": (["--smoke"], "bubble share (stage 0)"),
    "trainer_overhead": (["--smoke"], "engine/plain"),
    "trainer_overlap": (["--smoke"], "step time overlapped/synchronous"),
    "trainer_recompute": (["--smoke"], "same final loss on and off"),
    "trainer_tensor_parallel": (["--smoke"], "TP=2 + sequence parallel"),
}
ROOT = {"fabric_emulation", "fabric_netns", "replan_closed_loop"}  # test_fabric_*, test_replan_* below
CLUSTER = {"operator_apply", "shared_queue"}  # tests/e2e/bench/test_smoke.py


@pytest.mark.parametrize("script", sorted(PURE))
def test_small_mode_runs_to_its_table(script):
    args, expect = PURE[script]
    p = run_bench(script, *args)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert expect in p.stdout, p.stdout


def test_fabric_netns_shapes_the_trunk_and_leaves_nothing_behind(fabric):
    fab = fabric
    spec = fab.two_islands(per_island=2, fast_mbit=2000, cross_mbit=200)
    with fab.exclusive():
        fab.destroy(spec)
        try:
            fab.build(spec)
            a1, b1 = (next(n for n in spec.nodes if n.island == i) for i in "ab")
            a2 = next(n for n in spec.nodes if n.island == "a" and n is not a1)
            cross = fab.measure_mbit(a1, b1, megabytes=4)
            intra = fab.measure_mbit(a1, a2, megabytes=16)
        finally:
            fab.destroy(spec)
        assert not set(spec.namespaces) & fab.existing_namespaces()
    assert 0 < cross <= 200 * 1.1, cross  # the tbf on the trunk holds
    assert intra > 2 * cross, (intra, cross)  # traffic inside an island does not cross it


def test_fabric_netns_delays_the_trunk_at_its_rate_and_leaves_no_delay_line_behind(fabric):
    """20 ms each way through bench/delay_line.py: a TCP connect across takes ~40 ms, one inside
    an island none, a stream still gets the trunk's tbf rate; destroy ends the delay line."""
    fab = fabric
    if fab.delay_line_problem():
        pytest.skip(fab.delay_line_problem())
    spec = fab.two_islands(per_island=2, fast_mbit=2000, cross_mbit=50, cross_delay_ms=20)
    with fab.exclusive():
        fab.destroy(spec)
        try:
            fab.build(spec)
            pids = fab.delay_line_pids()
            a1, b1 = (next(n for n in spec.nodes if n.island == i) for i in "ab")
            a2 = next(n for n in spec.nodes if n.island == "a" and n is not a1)
            rtt_cross, rtt_intra = fab.measure_rtt_ms(a1, b1), fab.measure_rtt_ms(a1, a2)
            cross = fab.measure_mbit(a1, b1, megabytes=12)
            fab.set_trunk(2000, delay_ms=0)  # back to a plain veth: no delay, no delay line
            rtt_plain, plain_pids = fab.measure_rtt_ms(a1, b1), fab.delay_line_pids()
            fab.set_trunk(50, delay_ms=20)
            again = fab.delay_line_pids()
        finally:
            fab.destroy(spec)
        assert not set(spec.namespaces) & fab.existing_namespaces()
    assert len(pids) == 1 and plain_pids == [] and len(again) == 1, (pids, plain_pids, again)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids + again)
    assert 39 <= rtt_cross <= 55, rtt_cross  # two crossings of 20 ms, and a little scheduling
    assert rtt_intra < 5 and rtt_plain < 5, (rtt_intra, rtt_plain)
    assert 50 * 0.7 <= cross <= 50 * 1.1, cross  # the tbf still shapes (TCP's ramp-up costs a bit)


def test_fabric_emulation_small_mode_trains_the_holmes_layout_in_namespaces(fabric):
    p = run_bench("fabric_emulation", "--smoke", timeout=400)
    out = p.stdout + p.stderr[-3000:]
    assert p.returncode == 0, out
    row = re.search(r"^\s*holmes\s+no\s+2/2\s+([0-9.]+)\s", p.stdout, re.M)
    assert row and float(row.group(1)) > 0, out  # DP inside the islands, a measured step time


def test_replan_closed_loop_small_mode_replans_a_slowed_island_once(fabric):
    """Island B's process at a quarter of island A's CPU budget: the operator's re-plan step,
    fed the trainer's own measurements, moves layers off B and relaunches from a checkpoint."""
    p = run_bench("replan_closed_loop", "--smoke", timeout=400)
    out = p.stdout + p.stderr[-3000:]
    assert p.returncode == 0, out
    on = re.search(r"^\s*on\s+(\S+) -> (\S+)\s+1\s", p.stdout, re.M)  # e.g. 3A/3B -> 5A/1B, 1 re-plan
    assert on, out
    on_a = [sum(int(s[:-1]) for s in split.split("/") if s.endswith("A")) for split in on.groups()]
    assert on_a[1] > on_a[0], out  # more layers on the faster island
    assert re.search(r"relaunched from the checkpoint of iteration \d+", p.stdout), out


def test_every_bench_script_has_a_small_mode_test():
    scripts = {p.stem for p in BENCH.glob("*.py")} - LIBRARIES
    covered = set(PURE) | ROOT | CLUSTER | set(OWN_TESTS)
    assert scripts <= covered, f"bench scripts without a small-mode test: {sorted(scripts - covered)}"
    assert covered <= scripts, f"listed here but gone from bench/: {sorted(covered - scripts)}"
    for script, test in OWN_TESTS.items():
        assert re.search(rf'run_bench\(\s*"{script}"', (REPO / test).read_text()), (script, test)
    on_the_cluster = (REPO / "tests/e2e/bench/test_smoke.py").read_text()
    for script in CLUSTER:
        assert re.search(rf'run_bench\(\s*"{script}"', on_the_cluster), (
            script,
            "tests/e2e/bench/test_smoke.py",
        )
