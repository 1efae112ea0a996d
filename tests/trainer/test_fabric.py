"""The fabric preflight: device checks against fake sysfs/dev trees, NCCL log parsing, and the
whole check on 2 gloo ranks (fail stops every rank with the same message, warn reports)."""

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
from holmes.trainer.fabric import configure_nccl_debug, rdma_problems, select_hcas, transports_in
from holmes.trainer.metrics import MetricsSink
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


NCCL_LOG = """\
node-a:812:812 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to eth0
node-a:812:812 [0] NCCL INFO NET/IB : No device found.
node-a:812:812 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>
node-a:812:812 [0] NCCL INFO Using network Socket
node-a:812:830 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
"""


def test_transports_are_read_from_nccl_debug_lines():
    assert transports_in(NCCL_LOG) == {"Socket"}
    ib_line = "h:1:1 [0] NCCL INFO Channel 01/0 : 1[1] -> 0[0] [receive] via NET/IBext_v8/1"
    assert transports_in(ib_line) == {"IB"}
    assert transports_in("h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC") == set()
    dp = {"kind": "dp", "size": 4, "net": "IB"}
    f = fabric.transport_finding(3, "node-a", dp, transports_in(NCCL_LOG))
    assert f.message() == "rank 3 on node node-a: dp group (4 ranks) expects IB, found NCCL using Socket"
    assert fabric.transport_finding(3, "node-a", dp, {"IB"}) is None
    assert fabric.transport_finding(3, "node-a", dp, set()) is None  # NVLink/SHM: no network


def test_nccl_log_is_followed_from_where_it_was(tmp_path):
    path = tmp_path / "nccl.log"
    path.write_text("old Using network IB\n")
    log = fabric.NcclLog(str(path))
    assert log.new_text() == ""
    with path.open("a") as f:
        f.write(NCCL_LOG)
    assert transports_in(log.new_text()) == {"Socket"}
    assert log.new_text() == ""


def test_nccl_debug_is_configured_without_overriding_the_user(tmp_path):
    env: dict[str, str] = {}
    path = configure_nccl_debug(env, "warn", str(tmp_path))
    assert env["NCCL_DEBUG"] == "INFO" and "%p" in env["NCCL_DEBUG_FILE"]
    assert path is not None and "%" not in path
    user = {"NCCL_DEBUG": "WARN", "NCCL_DEBUG_FILE": "/x"}
    assert configure_nccl_debug(user, "warn") is None and user["NCCL_DEBUG"] == "WARN"
    off: dict[str, str] = {}
    assert configure_nccl_debug(off, "off") is None and off == {}


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
    assert start["check"] == "warn" and start["devices"] == "checked"
    assert start["transports"] == "skipped (backend gloo)"
    assert len(start["problems"]) == 2 and all("uverbs" in p for p in start["problems"])
    assert lines["done"]["fabricWarnings"] == start["problems"]


def test_healthy_pod_and_off_report_nothing(tmp_path):
    root = pod_root(tmp_path)
    layout = make_layout(1, 2, [4], 2, 4, gpus_per_node=1)
    ok = run_ranks(2, _train, tiny_config(iterations=1), layout, str(root))
    assert {x["holmes"]: x for x in ok[0][1]["lines"]}["start"]["fabric"]["problems"] == []
    bad = pod_root(tmp_path / "bad", uverbs=False)
    off = run_ranks(2, _train, tiny_config(iterations=1, fabric_check="off"), layout, str(bad))
    assert {x["holmes"]: x for x in off[0][1]["lines"]}["start"]["fabric"]["check"] == "off"
