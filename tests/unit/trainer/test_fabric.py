"""The fabric preflight: device checks against fake sysfs/dev trees, which groups are pinned to
which network, and the whole check on 2 gloo ranks (fail stops every rank with the same
message, warn moves the broken IB groups to Socket and reports)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from holmes.contract import load_job
from holmes.contract.jobspec import SpecError
from holmes.trainer import fabric
from holmes.trainer.engine import Trainer
from holmes.trainer.fabric import rdma_problems, select_hcas
from holmes.trainer.reporting import MetricsSink
from tests.helpers.labeller.fakesysfs import FakeSysfs
from tests.helpers.trainer.fakepod import pod_root
from tests.helpers.trainer.trainer_harness import make_layout, run_ranks, tiny_config


def problems(root: Path, **env: str) -> list[str]:
    return rdma_problems(root / "sys", root / "dev", env)


def test_a_pod_with_its_hca_and_uverbs_has_no_problem(tmp_path):
    root = pod_root(tmp_path, hcas=2)
    assert problems(root) == []
    assert problems(root, NCCL_IB_HCA="mlx5_1:1", NCCL_IB_DISABLE="0") == []


def test_missing_rdma_resource_is_named(tmp_path):
    root = pod_root(tmp_path, uverbs=False)
    (p,) = problems(root)
    assert "uverbs" in p and "RDMA resource" in p


def test_ib_disabled_in_env_and_unknown_hca_are_named(tmp_path):
    root = pod_root(tmp_path)
    found = problems(root, NCCL_IB_DISABLE="1", NCCL_IB_HCA="=mlx5_7")
    assert any("NCCL_IB_DISABLE=1" in p for p in found)
    assert any("mlx5_7" in p and "present: mlx5_0" in p for p in found)


def test_a_port_that_is_down_is_not_usable(tmp_path):
    root = pod_root(tmp_path)
    FakeSysfs(root / "sys").set_port_state("mlx5_0", 1, "1: DOWN")
    (p,) = problems(root)
    assert "no ACTIVE port on mlx5_0" in p


def test_roce_gid_index_must_be_populated_roce_v2(tmp_path):
    root = pod_root(tmp_path, kind="roce-gid")
    assert problems(root, NCCL_IB_GID_INDEX="3") == [] == problems(root)  # set, or NCCL's own choice
    (p,) = problems(root, NCCL_IB_GID_INDEX="2")
    assert "NCCL_IB_GID_INDEX=2 is not RoCE v2 on RoCE port mlx5_0:1 (IB/RoCE v1, 10.0.0.5)" in p
    (p,) = problems(root, NCCL_IB_GID_INDEX="1")
    assert "NCCL_IB_GID_INDEX=1 is link-local on RoCE port mlx5_0:1" in p
    (p,) = problems(root, NCCL_IB_GID_INDEX="5")
    assert "NCCL_IB_GID_INDEX=5 is empty on RoCE port mlx5_0:1" in p
    assert problems(root, NCCL_IB_GID_INDEX="x")[0].startswith("NCCL_IB_GID_INDEX=x is not a number")


def test_gid_index_is_not_checked_on_infiniband_ports(tmp_path):
    assert problems(pod_root(tmp_path), NCCL_IB_GID_INDEX="5") == []


def test_nccl_ib_hca_syntax():
    present = ["mlx5_0", "mlx5_1", "mlx5_10"]
    assert select_hcas(present, None) == ([(h, None) for h in present], [])
    assert select_hcas(present, "mlx5_1") == ([("mlx5_1", None), ("mlx5_10", None)], [])
    assert select_hcas(present, "=mlx5_1:1,mlx5_9") == ([("mlx5_1", 1)], ["mlx5_9"])
    assert select_hcas(present, "^=mlx5_0") == ([("mlx5_1", None), ("mlx5_10", None)], [])


def test_nccl_host_placeholder_is_the_hostname_cut_at_its_first_dot():
    """NCCL fills %h with the hostname up to its first dot; the full name (common with
    hostNetwork: gpu-1.cluster.local) named a file NCCL never writes."""
    env = {"NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p.log"}
    assert fabric.nccl_log_path(env, hostname="gpu-1.cluster.local", pid=42) == "/tmp/nccl.gpu-1.42.log"
    assert fabric.nccl_log_path({}, hostname="gpu-1") is None


def test_groups_inside_one_node_are_not_pinned_to_a_network():
    """An NVLink-only tensor-parallel group pinned to IB would need a working HCA for nothing."""
    from holmes.trainer.groups import pinned_net

    layout = make_layout(2, 2, [2, 2], 2, 4, gpus_per_node=4, tensor=2)
    tp = next(g for g in layout.process_groups("tp"))
    dp = next(g for g in layout.process_groups("dp"))
    p2p = next(g for g in layout.process_groups("p2p"))
    assert pinned_net(layout, tp.ranks, tp.net) is None  # ranks 0, 1: node 0
    assert pinned_net(layout, dp.ranks, dp.net) is None  # ranks 0, 2: node 0 too
    assert pinned_net(layout, p2p.ranks, p2p.net) == "Socket"  # rank 0 (node 0) to rank 4 (node 1)


def test_warn_moves_only_the_groups_with_a_rank_without_ib_to_socket():
    layout = make_layout(2, 2, [2, 2], 2, 4, gpus_per_node=1)  # dp groups (0,1) and (2,3) on IB
    assert fabric.fallback_nets(layout, set()) == {}
    moved = fabric.fallback_nets(layout, {3})
    assert moved == {(2, 3): "Socket"}  # stage 0's dp group keeps IB
    assert fabric.ib_groups_of(layout, 0) == ["dp group (2 ranks)"]


def test_job_fabric_check_field():
    base = {
        "model": {"layers": 2, "hiddenSize": 8, "attentionHeads": 2, "seqLength": 8, "vocabSize": 16},
        "training": {"globalBatchSize": 4, "microBatchSize": 1, "iterations": 1, "learningRate": 0.1},
        "nodes": {"count": 1, "gpusPerNode": 1},
    }
    assert load_job(base).training.fabric_check == "warn"
    base["training"]["fabricCheck"] = "fail"
    assert load_job(base).training.fabric_check == "fail"
    base["training"]["fabricCheck"] = False  # what YAML makes of a bare off
    with pytest.raises(SpecError, match=r'spec.training.fabricCheck.*write "off" in quotes'):
        load_job(base)


# ---- the whole check on 2 gloo ranks, with HOLMES_FABRIC_ROOT at a fake pod -------------------


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


# ---- every step bounded: a rank that fails, hangs or dies does not hold the others ------------

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


def test_step_deadline_from_the_timeout_or_the_environment():
    assert fabric.step_seconds({}, 600) == 150 and fabric.step_seconds({}, 30) == 7.5
    assert fabric.step_seconds({fabric.STEP_ENV: "20"}, 600) == 20
    for bad in ("0", "600", "soon"):
        with pytest.raises(fabric.FabricError, match=f"HOLMES_FABRIC_STEP_SECONDS={bad} must be"):
            fabric.step_seconds({fabric.STEP_ENV: bad}, 600)


def test_the_engine_drops_nccl_net_from_its_env_and_refuses_it_in_nccl_conf(tmp_path, monkeypatch):
    """Before: an NCCL_NET in the template's env or in the image's nccl.conf silently moved every
    group the engine pins (IB inside an island, Socket across) onto that one network."""
    import os

    from holmes.trainer import groups

    nowhere = tmp_path / "no-etc" / "nccl.conf"
    env = {"NCCL_NET": "IB", "NCCL_DEBUG": "INFO"}
    assert "removed NCCL_NET=IB" in groups.guard_nccl_net(env, home=tmp_path, etc=nowhere)
    assert env == {"NCCL_DEBUG": "INFO"}
    conf = tmp_path / "site.conf"
    conf.write_text("NCCL_IB_TIMEOUT=22\nNCCL_NET=Socket\n")
    with pytest.raises(
        groups.NetOverrideError, match=rf"NCCL_NET=Socket in {conf} would override.*NCCL_CONF_FILE"
    ):
        groups.guard_nccl_net({"NCCL_CONF_FILE": str(conf)}, home=tmp_path, etc=nowhere)
    layout = make_layout(1, 2, [4], 2, 4, gpus_per_node=1)
    monkeypatch.setenv("NCCL_CONF_FILE", str(conf))
    with pytest.raises(groups.NetOverrideError):  # before NCCL is touched (this build has none)
        groups.init_world(layout, "nccl", 30)
    conf.write_text("NCCL_IB_TIMEOUT=22\n")
    monkeypatch.setenv("NCCL_NET", "IB")
    with pytest.raises(ImportError, match="ProcessGroupNCCL"):  # on to the NCCL options: none here
        groups.init_world(layout, "nccl", 30)
    assert "NCCL_NET" not in os.environ


def test_the_engine_refuses_torchcomms_when_its_groups_need_several_nets():
    """torch 2.13 passes TorchComms no per-group options: the pinned nets would be claimed in the
    start line while NCCL picked one network for every group."""
    from holmes.trainer import groups

    two = make_layout(2, 2, [2, 2], 2, 4, gpus_per_node=2)  # dp inside a node, p2p across: Socket
    assert groups.pinned_nets(two) == {"Socket"}
    assert "WARNING: TorchComms is on" in groups.torchcomms_note(two, True)
    four = make_layout(2, 2, [2, 2], 2, 4, gpus_per_node=1)  # dp on IB, p2p and world on Socket
    assert groups.pinned_nets(four) == {"IB", "Socket"}
    with pytest.raises(groups.NetOverrideError, match="TorchComms is on.*pins IB and Socket"):
        groups.torchcomms_note(four, True)
    assert groups.torchcomms_note(four, False) is None
