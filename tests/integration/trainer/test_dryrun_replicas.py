"""The dry run (holmes.trainer.dryrun) of a job that trains as replicas across islands
(acrossIslands.mode replicas, outer.py): every replica's ranks on the fake process group, the
outer group over the replicas a fake group too, and the checks made of it. Each run is a
process of its own (the fake CUDA device must be set up before torch is imported)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.trainer.dryrun_harness import job
from tests.helpers.trainer.trainer_harness import make_layout

pytestmark = pytest.mark.cpu_torch  # the dry run's fake CUDA device (tests/conftest.py)

REPO = Path(__file__).resolve().parents[3]
W = 4  # each replica's world: P=2 x D=2
ACROSS = {
    "mode": "replicas",
    "innerSteps": 50,
    "fragments": 2,
    "overlapSteps": 1,
    "exchangeDtype": "bfloat16",
}

# Runs the dry run with a change made first (the deliberately broken cases below); the exit
# goes through os._exit as the tool's own does (the fake devices' autograd threads never join).
DRIVER = """
import os, sys
from holmes.trainer import dryrun, outer
from torch import distributed as dist
{change}
code = dryrun.main(sys.argv[1:])
sys.stdout.flush()
os._exit(code)
"""


def replicas_job(tmp: Path, **across) -> tuple[str, list[str]]:
    path = job(
        tmp, pipeline=2, data=2, tensor=1, globalBatchSize=2 * 2 * 4 * 2, acrossIslands={**ACROSS, **across}
    )
    layout = make_layout(2, 2, [2, 2], 2, 4, embedding=True)
    layouts = []
    for r in range(2):
        layouts.append(str(tmp / f"layout-{r}.json"))
        Path(layouts[-1]).write_text(layout.to_json())
    return path, layouts


def dry_run(job_path: str, layouts: list[str], *args: str, change: str = "") -> tuple[int, dict, str]:
    # a change lives in this process only: its ranks must not go to the tool's worker processes
    argv = ["--job", job_path, "--layout", *layouts, *args, *(["--jobs", "1"] if change else [])]
    cmd = (
        [sys.executable, "-c", DRIVER.format(change=change)]
        if change
        else [sys.executable, "-m", "holmes.trainer.dryrun"]
    )
    done = subprocess.run([*cmd, *argv], capture_output=True, text=True, cwd=REPO, timeout=600)
    out = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    return done.returncode, out, done.stderr[-3000:]


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory):
    """Two replicas of P=2 x D=2 with a tied embedding, two fragments, one overlapped step, the
    deltas in bf16: every rank of both replicas runs."""
    tmp = tmp_path_factory.mktemp("dryreplicas")
    path, layouts = replicas_job(tmp)
    code, out, err = dry_run(path, layouts, "--ranks", "all", "--collectives")
    assert out, err
    return code, out


def test_two_replicas_pass_every_check_through_an_outer_step_and_its_settle(two_replicas):
    """Before: the dry run took one layout and never built the outer group; with the outer group
    built, OuterSync.join's key was a host tensor (NCCL takes device tensors only) and its
    answer read four device values, which the fake run cannot know (it stopped there)."""
    code, out = two_replicas
    assert out["problems"] == [] and code == 0, out["problems"]
    assert out["replicas"] == 2 and [r["rank"] for r in out["ranks"]] == list(range(2 * W))
    assert [r["replica"] for r in out["ranks"]] == [0] * W + [1] * W
    summary = out["outer"]
    # fragment due every overlapSteps + 2 = 3 steps: sent after 3, applied (settled) after 4
    assert summary["innerStepsRun"] == 6 and out["iterations"] == 5
    assert summary["outerStepsRun"] == 1
    for r in out["ranks"]:
        assert r["outerIterations"] == [3, 4]
        assert all(n <= 1 for i, n in r["hostSyncsBy"].items() if i != "iteration 1"), r["hostSyncsBy"]


def test_the_outer_group_is_rank_k_of_every_replica_and_its_sequences_match(two_replicas):
    _, out = two_replicas
    by_rank = {r["rank"]: r for r in out["ranks"]}
    for k in range(W):
        seqs = []
        for g in (k, W + k):
            calls = [c for c in by_rank[g]["collectives"] if c["name"].startswith("holmes-outer/")]
            assert {tuple(c["group"]) for c in calls} == {(k, W + k)}
            assert {c["device"] for c in calls} == {"cuda"}  # NCCL's kind of tensor, join's key too
            seqs.append([(c["op"], c["dtype"], c["bytes"]) for c in calls])
        assert seqs[0] == seqs[1]
        # join's key, then the one fragment sent, in bf16: half the fp32 master shard's bytes
        outer = by_rank[k]["outer"]
        assert seqs[0] == [("allreduce_", "int64", 32), ("allreduce_", "bfloat16", outer["fragmentBytes"][0])]


def test_the_outer_state_is_counted_in_gpu_memory_and_the_group_as_a_communicator(two_replicas):
    _, out = two_replicas
    for r in out["ranks"]:
        outer = r["outer"]
        shard = outer["bytesPerCycle"] // 2  # elements: bf16 on the wire
        assert outer["stateBytes"] == shard * 4 * 2  # fp32 anchor and momentum
        assert r["peakBytesBy"]["outer"] >= outer["stateBytes"]
        kinds = {c["kind"]: c for c in r["communicatorList"]}
        assert kinds["outer"] == {"kind": "outer", "size": 2, "net": "Socket"}
    for row in out["stages"]:
        assert row["withoutOuterGiB"] < row["dryRunPeakGiB"]


def test_replicas_whose_fragments_differ_are_reported(tmp_path):
    """Replica 1 cuts its fragments one element off replica 0's: every fragment still tiles its
    shard, but the all-reduces over the link differ in size, which would corrupt the weights."""
    path, layouts = replicas_job(tmp_path)
    change = """
real = outer.OuterSync.__init__
def init(self, opt, spec, group):
    real(self, opt, spec, group)
    if group.rank == 1:
        last = len(self.slices) - 1
        cut = lambda f, s: slice(s.start + (f > 0), s.stop + (f < last))
        self.slices = [[cut(f, s) for s in per] for f, per in enumerate(self.slices)]
outer.OuterSync.__init__ = init
"""
    code, out, err = dry_run(path, layouts, "--ranks", "0,4", change=change)
    assert code == 1, err
    assert any("group [0, 4]" in p and "differ at collective #1" in p for p in out["problems"]), out[
        "problems"
    ]


def test_an_outer_all_reduce_on_the_wrong_group_is_reported(tmp_path):
    """The overlapped exchange sent over the replica's own world instead of the outer group: the
    sequences inside each replica still match, but the outer group misses the exchange."""
    path, layouts = replicas_job(tmp_path)
    change = "outer.OuterGroup.all_reduce_async = lambda self, t: dist.all_reduce(t, async_op=True)"
    code, out, err = dry_run(path, layouts, "--ranks", "0,4", change=change)
    assert code == 1, err
    wrong = [p for p in out["problems"] if "the outer group saw 1 collectives" in p]
    assert len(wrong) == 2, out["problems"]


def test_replica_layouts_that_cannot_pair_and_a_pipeline_job_are_refused(tmp_path):
    path, layouts = replicas_job(tmp_path)
    Path(layouts[1]).write_text(make_layout(2, 2, [3, 1], 2, 4, embedding=True).to_json())
    code, _, err = dry_run(path, layouts)
    assert code == 2 and "replica 1" in err and "stageLayers" in err
    pipeline = job(tmp_path, pipeline=2, data=2, tensor=1, globalBatchSize=32)
    code, _, err = dry_run(pipeline, [layouts[0], layouts[0]])
    assert code == 2 and "acrossIslands.mode is pipeline" in err


def test_the_example_replicas_job_at_64_gpus_passes_and_the_planner_counts_the_outer_state():
    """examples/jobs/gpt-7b-replicas.yaml on the paper's nodes: two islands of 4 nodes x 8 GPUs,
    a 7.4B GPT per replica (P=1 x D=32), planned by holmes dryrun --nodes as the operator would."""
    cli = [sys.executable, "-m", "holmes.cli", "dryrun", "--nodes", "examples/nodes/paper.yaml"]
    done = subprocess.run(
        [*cli, "--job", "examples/jobs/gpt-7b-replicas.yaml"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=900,
    )
    out = json.loads(done.stdout)
    assert done.returncode == 0 and out["problems"] == [], (out["problems"], done.stderr[-2000:])
    assert out["replicas"] == 2 and out["worldSize"] == 32 and out["ranksRun"] == [0, 32]
    assert out["outer"]["outerStepsRun"] == 1 and out["outer"]["exchangeDtype"] == "bfloat16"
    for row in out["stages"]:
        assert row["dryRunPeakGiBBy"]["outer"] > 1.5  # fp32 anchor + momentum of a 1/32 shard of 7.4B
        assert abs(row["plannedOverDryRun"] - 1) < 0.02, row
