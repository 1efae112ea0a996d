"""The dry run (holmes.trainer.dryrun) on a small world: the real engine on fake CUDA and the fake
process group, every rank, and the checks it makes. Each run is a process of its own (the fake
CUDA device must be set up before torch is imported)."""

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


def dry_run(job_path: str, layout, tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    lp = tmp_path / "layout.json"
    lp.write_text(layout.to_json())
    done = subprocess.run(
        [sys.executable, "-m", "holmes.trainer.dryrun", "--job", job_path, "--layout", str(lp), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    out = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    return done.returncode, out, done.stderr[-3000:]


@pytest.fixture(scope="module")
def three_stages(tmp_path_factory):
    """P=3 (so the pp group differs from each boundary's p2p group), D=2, T=2 with sequence
    parallelism and a tied embedding: every group kind; every one of the 12 ranks runs."""
    tmp = tmp_path_factory.mktemp("dry")
    layout = make_layout(3, 2, [2, 1, 1], 2, 4, gpus_per_node=4, embedding=True, tensor=2)
    code, out, err = dry_run(
        job(tmp, pipeline=3, data=2, tensor=2), layout, tmp, "--ranks", "all", "--collectives"
    )
    assert out, err
    return code, out, layout


def test_every_rank_runs_and_every_check_passes(three_stages):
    code, out, layout = three_stages
    assert out["problems"] == [] and code == 0, out["problems"]
    assert out["sequencesMatch"] is True
    assert [r["rank"] for r in out["ranks"]] == list(range(12))
    for r in out["ranks"]:
        assert r["peakBytes"] == sum(r["peakBytesBy"].values()) > 0
        assert r["peakBytesBy"]["parameters"] > 0 and r["peakBytesBy"]["optimizer"] > 0
        ops = {c["op"] for c in r["collectives"]}
        assert {"allreduce_", "_reduce_scatter_base_", "_allgather_base_"} <= ops, ops
        if r["stage"] > 0:
            assert r["peakBytesBy"]["pipelineBuffers"] > 0  # receive buffers of activations


def test_steady_state_has_one_host_sync_the_documented_read(three_stages):
    """Before: a blocking upload from pageable memory, two float() reads of the grad norm and
    one Event.synchronize per stopwatch in every iteration."""
    _, out, _ = three_stages
    for r in out["ranks"]:
        steady = [s for s in r["hostSyncsWhere"] if s["phase"] == "iteration 2"]
        assert r["hostSyncs"] == len(steady) == 1, steady
        assert steady[0]["what"] == "blocking device->host copy" and "engine.py" in steady[0]["where"]


def test_the_pipeline_warm_up_neither_talks_on_the_pp_group_nor_reads_the_device(three_stages):
    """torch's _warmup_p2p sent a vote over the pp group (3 ranks here, not a boundary's p2p
    group of 2) and read it back with .item() on the first step."""
    _, out, layout = three_stages
    pp = {tuple(g.ranks) for g in layout.process_groups("pp")}
    for r in out["ranks"]:
        on_pp = [c for c in r["collectives"] if tuple(c["group"]) in pp]
        assert on_pp == [], on_pp[:4]
        assert not [s for s in r["hostSyncsWhere"] if "schedules.py" in s["where"]]
        p2p = [c for c in r["collectives"] if c["op"] in ("send", "recv_")]
        assert p2p and all(len(c["group"]) == 2 for c in p2p)


def test_p2p_communicators_are_the_layout_groups_and_their_pairs(three_stages):
    """Each p2p group: its own communicator (the preflight's probe, mixed batches) and the pair's
    that torch 2.13's _batch_p2p sends lone ops on; no pair on any other group."""
    _, out, layout = three_stages
    for r in out["ranks"]:
        kinds = [c["kind"] for c in r["communicatorList"]]
        assert kinds.count("p2p pair") == kinds.count("p2p") > 0, kinds
        assert not [k for k in kinds if k.endswith("pair") and k != "p2p pair"], kinds


def test_tensor_groups_over_two_nodes_of_an_nvlink_domain_pass_every_check(tmp_path):
    """tensor 4 on 2-GPU nodes (a GB200 NVL72 layout in small): each tensor group spans two nodes
    of one NVLink domain; every rank runs, every check passes, and the tensor collectives run on
    groups whose ranks sit on two nodes."""
    layout = make_layout(2, 1, [2, 2], 2, 4, gpus_per_node=2, embedding=True, tensor=4)
    assert layout.tensor_spans_nodes and layout.version == 4
    code, out, err = dry_run(
        job(tmp_path, pipeline=2, data=1, tensor=4, gpus_per_node=2),
        layout,
        tmp_path,
        "--ranks",
        "all",
        "--collectives",
    )
    assert out, err
    assert out["problems"] == [] and code == 0, out["problems"]
    assert out["sequencesMatch"] is True and [r["rank"] for r in out["ranks"]] == list(range(8))
    tp = {tuple(g.ranks) for g in layout.process_groups("tp")}
    assert {frozenset(r // 2 for r in g) for g in tp} == {frozenset({0, 1}), frozenset({2, 3})}
    on_tp = [c for r in out["ranks"] for c in r["collectives"] if tuple(c["group"]) in tp]
    assert on_tp and {"_allgather_base_", "_reduce_scatter_base_"} & {c["op"] for c in on_tp}


def test_a_mismatched_collective_sequence_is_reported():
    """The check itself: one rank of a group issuing a different all-reduce is found."""
    from holmes.trainer.dryrun.recording import Collective, sequence_problems

    a = [Collective((0, 1), "allreduce_", "float32", 64), Collective((0, 1), "allreduce_", "float32", 8)]
    b = [Collective((0, 1), "allreduce_", "float32", 64), Collective((0, 1), "allreduce_", "float32", 16)]
    problems = sequence_problems({0: a, 1: b})
    assert len(problems) == 1 and "collective #1" in problems[0]
    send = [Collective((0, 1), "send", "bfloat16", 32, peer=1)]
    assert sequence_problems({0: send, 1: []})  # a send nobody receives


def test_bad_arguments_get_a_clear_error(tmp_path):
    layout = make_layout(2, 1, [2, 2], 2, 4, embedding=True)
    path = job(tmp_path, pipeline=2, data=1, tensor=1)
    code, _, err = dry_run(path, layout, tmp_path, "--ranks", "99")
    assert code == 2 and "--ranks" in err
    code, _, err = dry_run(path, layout, tmp_path, "--jobs", "0")
    assert code == 2 and "--jobs 0: give 1 or more" in err


def test_the_planner_and_the_dry_run_count_a_communicator_alike():
    from holmes.plan import costmodel
    from holmes.trainer.dryrun import recording

    assert costmodel.NCCL_COMMUNICATOR_BYTES == recording.NCCL_COMMUNICATOR_BYTES


def test_holmes_dryrun_runs_the_tool_in_a_process_of_its_own(tmp_path):
    """The CLI imports no torch itself (tests/unit/repo/test_import_directions.py): it starts the tool."""
    layout = make_layout(2, 1, [2, 2], 2, 4, embedding=True)
    lp = tmp_path / "layout.json"
    lp.write_text(layout.to_json())
    jp = job(tmp_path, pipeline=2, data=1, tensor=1)
    cli = [sys.executable, "-m", "holmes.cli", "dryrun", "--job", jp]
    done = subprocess.run(
        [*cli, "--layout", str(lp), "--ranks", "0"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["ranksRun"] == [0]
    bad = subprocess.run(cli, capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "--layout" in bad.stderr


# the tied embedding's gradient all-reduce (dist_optimizer.py), seen in the recorded collectives
GRADIENT_BYTES = 128 * 64 * 2  # test_dryrun.job's vocabulary x hidden size, in bfloat16
ITERATIONS = 2  # the dry run's


def test_the_embedding_all_reduce_starts_in_backward_in_the_reduce_dtype(tmp_path):
    """Before: synchronous, in fp32, after the whole pipeline had drained (finish_grad_sync):
    on the last stage it came after the iteration's last gradient send."""
    layout = make_layout(2, 2, [2, 2], 2, 4, embedding=True)
    path = job(tmp_path, pipeline=2, data=2, tensor=1, gradReduceDtype="bfloat16")
    code, out, err = dry_run(path, layout, tmp_path, "--ranks", "all", "--collectives")
    assert code == 0 and out["problems"] == [], (err, out.get("problems"))
    embedding = {tuple(g.ranks) for g in layout.process_groups("embedding")}
    M = layout.micro_batches
    for r in out["ranks"]:
        calls = r["collectives"]
        # the gradient's all-reduces (the fabric check's probes on the group are a few bytes)
        emb = [
            i
            for i, c in enumerate(calls)
            if tuple(c["group"]) in embedding and c["op"] == "allreduce_" and c["bytes"] >= GRADIENT_BYTES
        ]
        assert len(emb) == ITERATIONS, [calls[i] for i in emb]
        assert {calls[i]["dtype"] for i in emb} == {"bfloat16"}
        if r["stage"] == 1:  # the last stage sends one input gradient per micro-batch
            sends = [i for i, c in enumerate(calls) if c["op"] == "send"]
            assert emb[0] < sends[M - 1], "the all-reduce waited for the pipeline to drain"


@pytest.mark.parametrize("schedule", ["ZBVZeroBubble", "InterleavedZeroBubble"])
def test_virtual_stage_schedules_pass_every_check_at_every_rank(tmp_path, schedule):
    """Two chunks per rank (V-shaped: the tied embedding's head on rank 0, no embedding group;
    looped: the wrap-around link's p2p group), a split backward, bf16 reduce: every group's
    sequence matches, one host sync per steady iteration, and every bucket reduced."""
    probe = make_layout(2, 2, [1, 1, 1, 1], 2, 8, schedule=schedule)
    layout = make_layout(2, 2, [1, 1, 1, 1], 2, 8, schedule=schedule, embedding=probe.embedding_split)
    path = job(tmp_path, pipeline=2, data=2, tensor=1, globalBatchSize=32, gradReduceDtype="bfloat16")
    code, out, err = dry_run(
        path, layout, tmp_path, "--ranks", "all", "--collectives", "--bucket-elements", "5000"
    )
    assert code == 0 and out["problems"] == [], (err, out.get("problems"))
    assert out["microBatchesRun"] == 4  # 2P: a virtual-stage schedule's warm-up
    wrap = {tuple(sorted(g.ranks)) for g in layout.process_groups("p2p") if g.stage == 1}
    for r in out["ranks"]:
        calls = r["collectives"]
        assert sum(c["op"] == "_reduce_scatter_base_" for c in calls) >= 2 * ITERATIONS
        on_wrap = [c for c in calls if tuple(sorted(c["group"])) in wrap and c["op"] in ("send", "recv_")]
        assert bool(on_wrap) == (schedule == "InterleavedZeroBubble"), on_wrap[:2]
