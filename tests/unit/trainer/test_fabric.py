"""The fabric preflight in-process: device checks against fake sysfs/dev trees, which groups are
pinned to which network, the engine's NCCL settings (the whole check on 2 gloo ranks:
tests/integration/trainer/test_fabric.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from holmes.contract import load_job
from holmes.contract.jobspec import SpecError
from holmes.trainer import fabric
from holmes.trainer.fabric import rdma_problems, select_hcas
from tests.helpers.labeller.fakesysfs import FakeSysfs
from tests.helpers.trainer.fakepod import pod_root
from tests.helpers.trainer.trainer_harness import make_layout


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


# ---- every step bounded: a rank that fails, hangs or dies does not hold the others ------------


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
    # on past the guard: the CPU wheel has no NCCL options; a CUDA build has them and goes on to
    # the rendezvous, which this process (no RANK) cannot join
    past = ImportError if not nccl_built() else ValueError
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # as a process outside torchrun
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(past, match="ProcessGroupNCCL|RANK expected"):
        groups.init_world(layout, "nccl", 30)
    assert "NCCL_NET" not in os.environ


def nccl_built() -> bool:
    """Whether this torch has NCCL's process group (a CUDA build; the CPU wheel has none)."""
    try:
        from torch.distributed import ProcessGroupNCCL  # noqa: F401
    except ImportError:
        return False
    return True


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


def test_the_nccl_net_guard_reads_the_nccl_conf_under_home_as_nccl_does(tmp_path):
    """Before: the guard looked in the password database's home; NCCL 2.30 (misc/param.cc,
    userHomeDir) reads $HOME, so with a random UID or an image-set HOME it checked another file."""
    from holmes.launch import hook
    from holmes.trainer import groups

    home = tmp_path / "image-home"
    home.mkdir()
    (home / ".nccl.conf").write_text("NCCL_NET=IB\n")
    nowhere = tmp_path / "no-etc" / "nccl.conf"
    env = {"HOME": str(home)}
    with pytest.raises(groups.NetOverrideError, match=rf"NCCL_NET=IB in {home}/.nccl.conf"):
        groups.guard_nccl_net(env, etc=nowhere)
    with pytest.raises(hook.HookError, match=rf"NCCL_NET=IB in {home}/.nccl.conf"):
        hook.check_nccl_net(dict(env), None, nowhere)
    assert groups.guard_nccl_net({"HOME": str(tmp_path)}, etc=nowhere) is None  # no file there
    assert groups.guard_nccl_net({}, etc=nowhere) is None  # HOME unset: NCCL reads no user file
