"""The fabric preflight's whole check on 2 forked gloo ranks: fail stops every rank with the same
message, warn moves the broken IB groups to Socket and reports, a broken communicator or a dying
rank does not leave its peers hanging (the device checks and group pinning, in-process:
tests/unit/trainer/test_fabric.py)."""

from __future__ import annotations

import io
import json

import torch

from holmes.trainer import fabric
from holmes.trainer.engine import Trainer
from holmes.trainer.reporting import MetricsSink
from tests.helpers.trainer.fakepod import pod_root
from tests.helpers.trainer.trainer_harness import make_layout, run_ranks, tiny_config


def _train(rank: int, cfg, layout, root: str) -> dict:
    out = io.StringIO()
    sink = MetricsSink(enabled=rank == 0, stream=out)
    trainer = Trainer(
        cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo", sink=sink, fabric_root=root
    )
    trainer.train()
    return {"lines": [json.loads(x) for x in out.getvalue().splitlines()]}


def test_fail_stops_every_rank_with_the_mismatch(tmp_path):
    root = pod_root(tmp_path, uverbs=False)
    layout = make_layout(1, 2, [4], 2, 4, gpus_per_node=1)  # DP over IB across node-0 and node-1
    cfg = tiny_config(iterations=1, fabric_check="fail")
    res = run_ranks(2, _train, cfg, layout, str(root), allow_exit=True)
    for rank in (0, 1):
        status, text = res[rank]
        assert status == "error" and "FabricError: fabric check failed (devices)" in text
        # every rank names both ranks' problems: all stop on the same decision
        assert "rank 0 on node node-0: dp group (2 ranks)" in text
        assert "rank 1 on node node-1: dp group (2 ranks)" in text
        assert "uverbs" in text and "fabricCheck: warn" in text


def test_warn_trains_and_reports_in_start_and_done(tmp_path):
    root = pod_root(tmp_path, uverbs=False)
    layout = make_layout(1, 2, [4], 2, 4, gpus_per_node=1)
    res = run_ranks(2, _train, tiny_config(iterations=1), layout, str(root))
    lines = {x["holmes"]: x for x in res[0][1]["lines"]}
    start = lines["start"]["fabric"]
    assert start["check"] == "warn" and start["devices"] == "checked" and start["groups"] == "checked"
    assert len(start["problems"]) == 3 and all("uverbs" in p for p in start["problems"][:2])
    assert "run on Socket instead" in start["problems"][2]
    assert lines["done"]["fabricWarnings"] == start["problems"]
    dp = [g for g in lines["start"]["groups"] if g["kind"] == "dp"]
    assert dp and dp[0]["net"] == "Socket"  # planned IB; pinned IB it would fail, not warn


def _record_nets(rank: int, cfg, layout, root: str) -> dict:
    """What pg_options would carry on NCCL (this CPU torch has no ProcessGroupNCCL): the net
    build_groups asks group_options for, per group; and the group the findings travel on."""
    from holmes.trainer import groups as groups_mod

    asked: list = []
    real_options, real_gather = groups_mod.group_options, torch.distributed.all_gather_object
    gathered_on: list = []

    def options(backend, net):
        asked.append(net)
        return real_options(backend, net)

    def gather(out, obj, group=None):
        gathered_on.append(torch.distributed.get_backend(group) if group is not None else "world")
        return real_gather(out, obj, group=group)

    groups_mod.group_options, torch.distributed.all_gather_object = options, gather
    try:
        trainer = Trainer(
            cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo", fabric_root=root
        )
    finally:
        groups_mod.group_options, torch.distributed.all_gather_object = real_options, real_gather
    return {"asked": asked, "gathered_on": gathered_on, "problems": trainer.fabric.messages()}


def test_a_broken_hca_under_warn_pins_socket_and_shares_findings_off_every_communicator(tmp_path):
    """Before: the dp group was pinned to IB whatever the check found (its first collective
    would then fail, not warn), and the findings were gathered on the world group (itself on
    IB with worldNet: IB). They now travel over the rendezvous store (TCP), not over any
    process group: a gloo gather also waits its full timeout for a peer that never comes."""
    root = pod_root(tmp_path, uverbs=False)
    layout = make_layout(1, 2, [4], 2, 4, gpus_per_node=1)
    res = run_ranks(2, _record_nets, tiny_config(iterations=1), layout, str(root))
    for rank in (0, 1):
        out = res[rank][1]
        assert out["asked"] == ["Socket"], out  # the dp group (node-0, node-1)
        assert out["gathered_on"] == [], out
        assert [p.split(":")[0] for p in out["problems"][:2]] == [
            "rank 0 on node node-0",
            "rank 1 on node node-1",
        ]


def _train_with_broken_groups(cfg, layout, rank: int, broken) -> None:
    """Build the trainer with every all-reduce on a group other than WORLD going through
    ``broken(group)`` first (it raises as NCCL does for a pinned network it cannot open, or
    kills the rank)."""
    real = torch.distributed.all_reduce

    def all_reduce(t, op=torch.distributed.ReduceOp.SUM, group=None, async_op=False):
        if group is not None and group is not torch.distributed.group.WORLD:
            broken(group)
        return real(t, op=op, group=group, async_op=async_op)

    torch.distributed.all_reduce = all_reduce
    try:
        Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo")
    finally:
        torch.distributed.all_reduce = real


def _ib_not_found(group) -> None:
    raise RuntimeError("ncclInvalidUsage: network IB not found")


def _probe_fails(rank: int, cfg, layout) -> dict:
    def broken(group):
        if torch.distributed.get_world_size(group) == 2:
            _ib_not_found(group)

    _train_with_broken_groups(cfg, layout, rank, broken)
    return {}


def test_a_group_that_cannot_be_created_stops_every_rank_with_one_report():
    """A pinned network NCCL cannot open fails the group's first collective: every rank says
    which group, where and why, in one gathered message, instead of crashing alone."""
    layout = make_layout(1, 2, [4], 2, 4, gpus_per_node=1)
    res = run_ranks(2, _probe_fails, tiny_config(iterations=1), layout, allow_exit=True)
    for rank in (0, 1):
        status, text = res[rank]
        assert status == "error" and "cannot create these communicators" in text, text[-2000:]
        assert "rank 0 on node node-0: dp group (2 ranks) expects IB" in text
        assert "rank 1 on node node-1" in text and "network IB not found" in text


def test_healthy_pod_and_off_report_nothing(tmp_path):
    root = pod_root(tmp_path)
    layout = make_layout(1, 2, [4], 2, 4, gpus_per_node=1)
    ok = run_ranks(2, _train, tiny_config(iterations=1), layout, str(root))
    assert {x["holmes"]: x for x in ok[0][1]["lines"]}["start"]["fabric"]["problems"] == []
    bad = pod_root(tmp_path / "bad", uverbs=False)
    off = run_ranks(2, _train, tiny_config(iterations=1, fabric_check="off"), layout, str(bad))
    assert {x["holmes"]: x for x in off[0][1]["lines"]}["start"]["fabric"]["check"] == "off"


STEP_S = 3.0  # HOLMES_FABRIC_STEP_SECONDS in these runs


PG_TIMEOUT_S = 60.0  # gloo's timeout: what the others waited before


def _rank_1_breaks_its_dp_group(rank: int, cfg, layout, how: str) -> dict:
    """Rank 1's dp communicator fails at once ("raises", as NCCL does when the pinned network is
    missing) or its process dies ("dies"); rank 0 is left in the dp group's all-reduce, as a
    peer is left in ncclCommInitRank."""
    import os

    os.environ[fabric.STEP_ENV] = str(STEP_S)

    def broken(group):
        if rank == 1:
            if how == "dies":
                os._exit(9)
            _ib_not_found(group)

    _train_with_broken_groups(cfg, layout, rank, broken)
    return {}


def test_a_rank_whose_communicator_fails_does_not_leave_its_peers_hanging():
    """Before: rank 0 waited in the dp all-reduce for gloo's timeout (60 s here, NCCL's 600 s
    in a pod, or the watchdog killed it first) and rank 1 in the gather for rank 0; nobody said
    anything until then. Now both report within the step's deadline, each naming both ranks."""
    import time

    layout = make_layout(1, 2, [4], 2, 4, gpus_per_node=1)
    cfg = tiny_config(iterations=1, timeout_seconds=PG_TIMEOUT_S)
    t0 = time.monotonic()
    res = run_ranks(
        2, _rank_1_breaks_its_dp_group, cfg, layout, "raises", pg_timeout=PG_TIMEOUT_S, allow_exit=True
    )
    seconds = time.monotonic() - t0
    assert seconds < 40, seconds  # 3 x the 3 s step plus start-up on a loaded machine; before: > 60
    for rank in (0, 1):
        status, text = res[rank]
        assert status == "error" and "fabric check failed (groups)" in text, text[-2000:]
        assert (
            "rank 1 on node node-1: dp group (2 ranks) expects IB, found RuntimeError: ncclInvalidUsage"
            in text
        )
        assert "rank 0 on node node-0: dp group (2 ranks) expects IB, found no communicator after 3 s" in text


def test_a_rank_that_dies_in_the_check_is_named_by_the_others():
    import time

    layout = make_layout(1, 2, [4], 2, 4, gpus_per_node=1)
    cfg = tiny_config(iterations=1, timeout_seconds=PG_TIMEOUT_S)
    t0 = time.monotonic()
    res = run_ranks(
        2, _rank_1_breaks_its_dp_group, cfg, layout, "dies", pg_timeout=PG_TIMEOUT_S, allow_exit=True
    )
    assert time.monotonic() - t0 < 40
    assert res[1] == ("exit", 9)
    status, text = res[0]
    assert status == "error" and "fabric check failed (groups)" in text, text[-2000:]
    assert "rank 1 on node node-1 did not answer within 6 s" in text  # twice the step: peers may still probe
