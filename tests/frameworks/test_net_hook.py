"""The network hook's decisions: every group torch creates gets the net of its members' island.

Groups are created for real (torch's fake process group: every rank of a world in one process,
one rank at a time); the NCCL branch, which the CPU wheel cannot run, is checked by recording
what the hook passes to torch's own function."""

import io
import json
import types
from datetime import timedelta

import pytest
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.testing._internal.distributed.fake_pg import FakeStore

from holmes.launch import hook
from holmes.launch.islands import Islands
from tests.frameworks.layouts import THREE


@pytest.fixture
def installed():
    log = io.StringIO()
    h = hook.install(Islands.from_layout(THREE), log=log)
    yield h, log
    hook.uninstall()
    if dist.is_initialized():
        dist.destroy_process_group()


def logged(log):
    return [json.loads(line)["holmesGroup"] for line in log.getvalue().splitlines()]


def test_islands_rule():
    isl = Islands.from_layout(THREE)
    assert isl.node_island == ("east/infiniband",) * 2 + ("west/roce",) * 2 + (None, None)
    assert isl.net([0, 2]) == "IB"  # a DP group of the IB stage, across its two nodes
    assert isl.net([4, 6]) == "IB"  # RoCE is an RDMA island too
    assert isl.net([8, 10]) == "Socket"  # the Ethernet stage
    assert isl.net([8, 9]) == "Socket"  # one node of a mixed stage: the Layout's tp net
    assert isl.net([0, 4]) == "Socket" and isl.net(range(12)) == "Socket"  # across islands
    with pytest.raises(ValueError, match="outside the Layout's world of 12"):
        isl.net([12])


def test_one_rdma_island_for_the_whole_world_is_ib():
    one = dict(THREE, pipeline=1, data=6, nodes=THREE["nodes"], stages=[THREE["stages"][0]])
    assert Islands.from_layout(one).net(range(12)) == "IB"


def test_default_group_and_new_groups_are_logged_once_by_their_lowest_rank(installed):
    h, log = installed
    for rank in range(12):
        dist.init_process_group("fake", rank=rank, world_size=12, store=FakeStore())
        for ranks in ([0, 2], [1, 3], [8, 10], [0, 4, 8]):
            dist.new_group(ranks)
        dist.destroy_process_group()
    lines = logged(log)
    assert [(tuple(g["ranks"]), g["net"]) for g in lines] == [
        (tuple(range(12)), "Socket"),
        ((0, 2), "IB"),
        ((0, 4, 8), "Socket"),
        ((1, 3), "IB"),
        ((8, 10), "Socket"),
    ]
    assert lines[0]["desc"] == "default_pg" and not any(g["applied"] for g in lines)  # fake, not NCCL
    assert len(h.decisions) == 12 * 5  # every rank decided every group (all ranks call it)


def test_device_mesh_groups(installed):
    from torch.distributed.device_mesh import init_device_mesh

    _, log = installed
    for rank in range(12):
        dist.init_process_group("fake", rank=rank, world_size=12, store=FakeStore())
        init_device_mesh("cpu", (3, 2, 2), mesh_dim_names=("pp", "dp", "tp"))
        dist.destroy_process_group()
    nets = {(g["desc"], tuple(g["ranks"])): g["net"] for g in logged(log)}
    dp = {r: n for (d, r), n in nets.items() if d == "mesh_dp"}
    assert dp == {
        (0, 2): "IB",
        (1, 3): "IB",
        (4, 6): "IB",
        (5, 7): "IB",
        (8, 10): "Socket",
        (9, 11): "Socket",
    }
    assert {n for (d, _), n in nets.items() if d == "mesh_pp"} == {"Socket"}
    assert len([d for d, _ in nets if d == "mesh_tp"]) == 6


class FakeNcclOptions:
    """What ProcessGroupNCCL.Options carries that the hook touches (absent from the CPU wheel)."""

    def __init__(self):
        self.is_high_priority_stream = True
        self.config = types.SimpleNamespace(net_name=None)


def test_nccl_branch_passes_the_net_in_new_options():
    seen = []
    h = hook.NetHook(Islands.from_layout(THREE), log=io.StringIO(), new_options=FakeNcclOptions)
    helper = h.wrap_helper(lambda *a, **kw: seen.append((a, kw)))
    helper(2, 0, [0, 2], "nccl", None, "g1", timeout=timedelta(seconds=5), group_desc="dp")
    (args, kw) = seen[0]
    assert args == (2, 0, [0, 2], "nccl", None, "g1") and kw["timeout"] == timedelta(seconds=5)
    opts = kw["backend_options"]
    assert opts.config.net_name == "IB" and opts.is_high_priority_stream is False  # torch's default


def test_nccl_branch_copies_the_callers_options_and_replaces_their_net():
    seen = []
    h = hook.NetHook(Islands.from_layout(THREE), log=io.StringIO(), new_options=FakeNcclOptions)
    helper = h.wrap_helper(lambda *a, **kw: seen.append(kw))
    mine = FakeNcclOptions()
    mine.config.net_name = "IB"  # e.g. Megatron's YAML saying dp: IB for every DP group
    helper(2, 0, [8, 10], "cpu:gloo,cuda:nccl", None, "g2", mine)  # positional, as a caller may
    assert seen[0]["backend_options"].config.net_name == "Socket"
    assert mine.config.net_name == "IB"  # the caller's object is left alone
    assert h.decisions[-1]["given"] == "IB" and h.decisions[-1]["applied"] is True


def test_split_group_children_get_their_own_net(installed):
    h, log = installed
    seen = []
    split = h.wrap_split(lambda **kw: seen.append(kw))
    h.new_options, h.split_options = FakeNcclOptions, lambda parent: FakeNcclOptions()
    for rank in (0, 8):
        dist.init_process_group("fake", rank=rank, world_size=12, store=FakeStore())
        split(split_ranks=[[0, 2], [1, 3], [8, 10], [9, 11]], backend="nccl", group_desc="dp")
        dist.destroy_process_group()
    assert [kw["pg_options"].config.net_name for kw in seen] == ["IB", "Socket"]
    assert [g["ranks"] for g in logged(log) if g.get("desc") == "dp"] == [[0, 2], [8, 10]]


def test_install_wraps_every_reference_and_uninstalls():
    import torch.distributed.device_mesh as dm

    before = c10d._new_process_group_helper, c10d.split_group
    hook.install(Islands.from_layout(THREE), log=io.StringIO())
    try:
        assert c10d._new_process_group_helper.__holmes_hook__
        assert c10d.split_group.__holmes_hook__ and dist.split_group is c10d.split_group
        assert dm.split_group is c10d.split_group
    finally:
        hook.uninstall()
    assert (c10d._new_process_group_helper, c10d.split_group) == before and dm.split_group is before[1]


def test_refuses_an_unsupported_torch():
    with pytest.raises(
        hook.HookError, match=r"torch 2\.12\.1\+cu124 is not supported.*2\.13\.x.*HOLMES_NET_HOOK=off"
    ):
        hook.check_torch("2.12.1+cu124", c10d)
    hook.check_torch("2.13.0+cpu", c10d)  # the pinned one passes
    changed = types.SimpleNamespace(
        _new_process_group_helper=lambda group_size, group_rank, ranks, backend, store, group_name: None,
        split_group=c10d.split_group,
    )
    with pytest.raises(hook.HookError, match="_new_process_group_helper has parameters"):
        hook.check_torch("2.13.1", changed)


def test_install_from_env(tmp_path):
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(THREE))
    assert hook.install_from_env({"HOLMES_NET_HOOK": "off", "HOLMES_LAYOUT": str(path)}) is None
    assert hook.install_from_env({}) is None
    try:
        h = hook.install_from_env({"HOLMES_LAYOUT": str(path)})
        assert h.islands.net([0, 2]) == "IB"
    finally:
        hook.uninstall()
