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
from tests.labeller.fakesysfs import FakeSysfs, infiniband_node, roce_node

from .trainer_harness import make_layout, run_ranks, tiny_config

ROCE_V2_GID = "0000:0000:0000:0000:0000:ffff:0a00:0005"


def pod_root(tmp_path: Path, kind: str = "infiniband", uverbs: bool = True, **kw) -> Path:
    """A pod's view: <root>/sys as sysfs shows the node's HCAs, <root>/dev/infiniband if mounted."""
    sysfs = tmp_path / "sys"
    if kind == "infiniband":
        infiniband_node(sysfs, **kw)
    elif kind == "roce-gid":
        fs = FakeSysfs(sysfs).base_host()
        fs.hca("mlx5_0", [("Ethernet", "100 Gb/sec", "4: ACTIVE")], gids={3: ROCE_V2_GID})
    else:
        roce_node(sysfs)
    if uverbs:
        (tmp_path / "dev" / "infiniband").mkdir(parents=True)
        (tmp_path / "dev" / "infiniband" / "uverbs0").touch()
    return tmp_path


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


def test_roce_gid_index_must_be_populated(tmp_path):
    root = pod_root(tmp_path, kind="roce-gid")
    assert problems(root, NCCL_IB_GID_INDEX="3") == []
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
    return {"asked": asked, "gathered_on": gathered_on, "host": trainer.vote.group is not None}


def test_a_broken_hca_under_warn_pins_socket_and_gathers_on_the_host_group(tmp_path):
    """Before: the dp group was pinned to IB whatever the check found (its first collective
    would then fail, not warn), and the findings were gathered on the world group (itself on
    IB with worldNet: IB)."""
    root = pod_root(tmp_path, uverbs=False)
    layout = make_layout(1, 2, [4], 2, 4, gpus_per_node=1)
    res = run_ranks(2, _record_nets, tiny_config(iterations=1), layout, str(root))
    for rank in (0, 1):
        out = res[rank][1]
        assert out["asked"] == ["Socket"], out  # the dp group (node-0, node-1)
        assert out["gathered_on"] and set(out["gathered_on"]) == {"gloo"}, out


def _probe_fails(rank: int, cfg, layout) -> dict:
    real = torch.distributed.all_reduce

    def all_reduce(t, op=torch.distributed.ReduceOp.SUM, group=None, async_op=False):
        size = torch.distributed.get_world_size(group)
        if size == 2 and group is not None and group is not torch.distributed.group.WORLD:
            raise RuntimeError("ncclInvalidUsage: network IB not found")
        return real(t, op=op, group=group, async_op=async_op)

    torch.distributed.all_reduce = all_reduce
    try:
        Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo")
    finally:
        torch.distributed.all_reduce = real
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
