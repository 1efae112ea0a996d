"""Pure parts of bench/replan_closed_loop.py and bench/cpu_limit.py: the brute force's candidate
layouts, status.progress from rank 0's metrics lines (what the bench hands the operator's
core/replan.step), and the CPU groups' files and wrapper. The benchmark itself runs in
tests/bench/test_smoke.py."""

import json
import os
import subprocess

import cpu_limit
import fabric_emulation as fe
import fabric_netns as fab
import pytest
import replan_closed_loop as rcl

from holmes.operator.core import replan
from holmes.plan import plan
from holmes.plan.calibrate import assess
from holmes.plan.planner import as_job
from holmes.trainer.engine import layout_signature


def setup(layers=8, per_island=2):
    a = rcl.build_parser().parse_args(["--layers", str(layers), "--per-island", str(per_island)])
    spec = fab.two_islands(per_island=per_island)
    nodes = fe.node_dicts(spec, 2.0)
    config = fe.planner_config(0.01, 2.0, 0.1)
    job = rcl.job_manifest(a, "/ckpt", 30, replan_on=True)
    return a, spec, nodes, config, job, plan(nodes, job, config=config)


def test_brute_force_runs_every_split_with_either_island_first():
    _, spec, nodes, config, job, first = setup()
    cands = rcl.candidates(nodes, as_job(job), first, config)
    names = [rcl.split_name(c, spec) for c in cands]
    assert len(set(names)) == len(names) == 2 * 7, names
    assert {n.split("/")[0][-1] for n in names} == {"A", "B"}  # both islands lead
    assert rcl.split_name(first, spec) in names  # the plan's own layout is among them
    for c in cands:
        assert [s.num_layers for s in c.stages] and sum(s.num_layers for s in c.stages) == 8
        for s in range(2):  # a stage never straddles the trunk; DP stays inside an island
            assert len({spec.node(n).island for n in c.stage_nodes(s)}) == 1
        assert c.estimate["iterationSeconds"] > 0


def metrics_lines(layout, compute, iterations=8):
    """Rank 0's metrics as the trainer writes them: a start line, then iteration lines whose
    stages are timed from the second on (stage_times.py)."""
    start = {
        "holmes": "start",
        "layout": {**layout_signature(layout), "nodes": list(layout.nodes)},
    }
    out = [start]
    for i in range(1, iterations + 1):
        rec = {
            "holmes": "iteration",
            "iteration": i,
            "iterationSeconds": 1.0 + 0.01 * i,
            "tokensPerSecond": 100,
        }
        if i > 1:
            rec["stages"] = [
                {"stage": s, "layers": st.num_layers, "computeSeconds": c, "p2pWaitSeconds": 0.1}
                for s, (st, c) in enumerate(zip(layout.stages, compute))
            ]
        out.append(rec)
        if i % 4 == 0:
            out.append({"holmes": "checkpoint", "iteration": i})
    return out


def test_progress_is_what_the_operator_reads_and_a_slow_island_is_replanned_away_from():
    _, spec, nodes, config, job, first = setup()
    slow = next(s for s in range(2) if rcl.split_name(first, spec).split("/")[s].endswith("B"))
    compute = [0.5, 0.5]
    compute[slow] = 2.0  # island B computes at a quarter of A's speed per layer
    assert rcl.progress_of(metrics_lines(first, compute, iterations=5)).get("stages") is None  # warm-up
    progress = rcl.progress_of(metrics_lines(first, compute))
    assert progress["iteration"] == 8 and progress["checkpointIteration"] == 8
    assert [r["samples"] for r in progress["stages"]] == [5, 5]  # 7 timed, the first 2 left out
    measured = replan.measured_in(progress, first)  # the operator's own reading of it
    assert measured is not None and [m.compute for m in measured.stages] == compute
    spec_ = as_job(job)
    step = replan.step(
        spec_,
        {},
        first,
        progress,
        nodes,
        lambda ns, j: plan(ns, j, config=config),
        lambda ns, j, lay, m: assess(ns, j, lay, m, config),
    )
    assert step.relaunch and step.adaptation["replans"] == 1, step
    after = plan(replan.measured_nodes(nodes, step.adaptation, spec_), spec_, config=config)
    b_layers = lambda lay: sum(  # noqa: E731
        s.num_layers for s in lay.stages if spec.node(lay.stage_nodes(s.index)[0]).island == "b"
    )
    assert b_layers(after) < b_layers(first), (rcl.split_name(first, spec), rcl.split_name(after, spec))


def test_read_records_skips_a_line_being_written(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps({"holmes": "start"}) + "\nnot json\n" + '{"holmes": "iteration", "iter')
    assert rcl.read_records(str(p)) == [{"holmes": "start"}]
    assert rcl.read_records(str(tmp_path / "missing")) == []


def test_cpu_budget_files_for_either_cgroup_version():
    assert cpu_limit.quota_files(2, 0.25) == {"cpu.max": "1000 4000"}
    assert cpu_limit.quota_files(2, None) == {"cpu.max": "max 4000"}
    assert cpu_limit.quota_files(1, 1.5) == {"cpu.cfs_period_us": "4000", "cpu.cfs_quota_us": "6000"}
    with pytest.raises(ValueError, match="at least 0.25 core"):  # the kernel's minimum quota, 1 ms
        cpu_limit.quota_files(1, 0.1)
    with pytest.raises(ValueError, match="> 0 cores"):
        cpu_limit.quota_files(2, 0)


def test_priority_gives_each_group_the_highest_weight_and_refuses_more_than_the_machine(tmp_path):
    """On a shared machine a quota alone guarantees nothing: the groups also get the highest
    weight, and budgets that would then starve everything else are refused."""
    assert cpu_limit.priority_files(1) == {"cpu.shares": "262144"}
    assert cpu_limit.priority_files(2) == {"cpu.weight": "10000"}
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    h = cpu_limit.Hierarchy(1, str(tmp_path))
    limits = cpu_limit.CpuLimits.create({"a": 0.3}, h, priority=True)
    assert (tmp_path / f"{cpu_limit.PREFIX}a" / "cpu.shares").read_text() == "262144"
    for f in os.listdir(limits.dir("a")):
        os.remove(os.path.join(limits.dir("a"), f))
    limits.remove()
    too_much = {str(i): 1.0 for i in range((os.cpu_count() or 1) + 1)}
    with pytest.raises(cpu_limit.CpuLimitError, match="exceed this machine's"):
        cpu_limit.CpuLimits.create(too_much, h, priority=True)
    assert not any(p.name.startswith(cpu_limit.PREFIX) for p in tmp_path.iterdir())


def test_detect_prefers_v2_with_cpu_and_says_what_is_missing(tmp_path):
    v2, v1 = tmp_path / "v2", tmp_path / "v1"
    v2.mkdir(), v1.mkdir()
    (v2 / "cgroup.controllers").write_text("memory pids\n")
    with pytest.raises(cpu_limit.CpuLimitError, match="no cgroup cpu controller"):
        cpu_limit.detect(str(v2), str(v1))
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_limit.detect(str(v2), str(v1)) == cpu_limit.Hierarchy(1, str(v1))
    (v2 / "cgroup.controllers").write_text("cpuset cpu io memory\n")
    assert cpu_limit.detect(str(v2), str(v1)) == cpu_limit.Hierarchy(2, str(v2))


def test_the_wrapped_command_itself_is_what_joins_the_group(tmp_path):
    """The shell writes its PID and then execs: the PID in cgroup.procs is the command's own."""
    group = tmp_path / "group"
    group.mkdir()
    out = subprocess.run(
        cpu_limit.wrap(str(group), ["sh", "-c", "echo $$", "with spaces"]), capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert (group / "cgroup.procs").read_text().strip() == out.stdout.strip()


def test_limits_are_created_and_removed_in_a_hierarchy(tmp_path):
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / f"{cpu_limit.PREFIX}stale").mkdir()  # a killed run's leftover
    limits = cpu_limit.CpuLimits.create({"a": 1.2, "b": 0.5}, cpu_limit.Hierarchy(1, str(tmp_path)))
    assert not (tmp_path / f"{cpu_limit.PREFIX}stale").exists()
    assert (tmp_path / f"{cpu_limit.PREFIX}b" / "cpu.cfs_quota_us").read_text() == "2000"
    limits.enforce(False)  # lifted for a start-up, then back
    assert (tmp_path / f"{cpu_limit.PREFIX}b" / "cpu.cfs_quota_us").read_text() == "-1"
    limits.enforce(True)
    assert (tmp_path / f"{cpu_limit.PREFIX}a" / "cpu.cfs_quota_us").read_text() == "4800"
    for name in "ab":  # a real cgroup directory empties itself; a plain one needs help
        for f in os.listdir(limits.dir(name)):
            os.remove(os.path.join(limits.dir(name), f))
    limits.remove()
    assert not any(p.name.startswith(cpu_limit.PREFIX) for p in tmp_path.iterdir())
