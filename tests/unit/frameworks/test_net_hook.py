"""The network hook's decisions: every group torch creates gets the net of its members' island.

Groups are created for real (torch's fake process group: every rank of a world in one process,
one rank at a time); the NCCL branch, which the CPU wheel cannot run, is checked by recording
what the hook passes to torch's own function."""

import io
import json
import os
import subprocess
import sys
import types
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch._C._distributed_c10d import FakeProcessGroup
from torch.testing._internal.distributed.fake_pg import FakeStore

from holmes.launch import hook
from holmes.launch.install import install as install_launcher
from holmes.launch.islands import Islands
from tests.helpers.frameworks.layouts import THREE


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


# ---- groups made without a backend, groups inside one node, at a real world size -------------

# 8 nodes x 8 GPUs, Megatron's order (tp fastest, then dp, then pp): tensor 8 inside each node,
# data 4 across the nodes of one island, pipeline 2 across an InfiniBand and a RoCE island.
SIXTY_FOUR = {
    "gpusPerNode": 8,
    "tensor": 8,
    "data": 4,
    "pipeline": 2,
    "nodes": [f"ib-{i}" for i in range(4)] + [f"roce-{i}" for i in range(4)],
    "stages": [
        {"island": "east/infiniband", "nic": "infiniband", "layers": [0, 16]},
        {"island": "west/roce", "nic": "roce", "layers": [16, 32]},
    ],
}
TP = [list(range(n * 8, n * 8 + 8)) for n in range(8)]
DP = [[s * 32 + d * 8 + t for d in range(4)] for s in range(2) for t in range(8)]
PP = [[r, r + 32] for r in range(32)]


class NetOptions(FakeProcessGroup.Options):
    """The fake backend's options with the one field of ProcessGroupNCCL.Options the hook sets:
    the fake group keeps the object it was created with, so each group's net can be read back
    (while the Python object lives: ``made`` holds every one)."""

    made: list["NetOptions"] = []

    def __init__(self):
        super().__init__()
        self.is_high_priority_stream = True
        self.config = types.SimpleNamespace(net_name=None)
        NetOptions.made.append(self)

    def __deepcopy__(self, memo):  # what copy.deepcopy does for ProcessGroupNCCL.Options
        twin = NetOptions()
        twin.is_high_priority_stream, twin.config.net_name = (
            self.is_high_priority_stream,
            self.config.net_name,
        )
        return twin


def net_of(pg) -> str | None:
    config = getattr(pg._get_backend(torch.device("cpu")).options, "config", None)
    return config.net_name if config is not None else None


@pytest.fixture
def fake_is_nccl(monkeypatch):
    """The fake backend stands in for NCCL: torch resolves a group made without a backend
    ("undefined") through its default backend for this machine's accelerator (the CPU here, NCCL
    for CUDA on a GPU node), and the hook treats the fake backend as the one taking NCCL options."""
    accelerator = torch._C._get_accelerator().type
    monkeypatch.setitem(dist.Backend.default_device_backend_map, accelerator, "fake")
    log = io.StringIO()
    h = hook.install(
        Islands.from_layout(SIXTY_FOUR),
        log=log,
        env={},
        new_options=NetOptions,
        split_options=lambda parent: NetOptions(),
        nccl="fake",
    )
    yield h, log
    hook.uninstall()
    NetOptions.made.clear()
    if dist.is_initialized():
        dist.destroy_process_group()


def test_groups_made_without_a_backend_get_their_island_net_and_one_node_groups_none(fake_is_nccl):
    """Before: init_process_group() without a backend records "undefined" and every new_group
    inherits it; the hook read "nccl" in that string, found none, and pinned nothing; and a
    group inside one node was pinned like any other."""
    h, log = fake_is_nccl
    nets: dict[tuple[int, ...], str | None] = {}
    for rank in range(64):
        dist.init_process_group(rank=rank, world_size=64, store=FakeStore())  # no backend
        assert dist.get_backend() == "undefined"
        nets[tuple(range(64))] = net_of(dist.group.WORLD)
        for ranks in TP + DP + PP:
            pg = dist.new_group(ranks)
            if rank in ranks:
                nets[tuple(ranks)] = net_of(pg)
        dist.destroy_process_group()
    assert nets[tuple(range(64))] == "Socket"  # the world spans both islands
    assert {nets[tuple(g)] for g in DP[:8]} == {"IB"} and {nets[tuple(g)] for g in DP[8:]} == {"IB"}
    assert {nets[tuple(g)] for g in PP} == {"Socket"}  # stage to stage, across islands
    assert {nets[tuple(g)] for g in TP} == {None}  # left to NCCL: NVLink / shared memory
    lines = {tuple(g["ranks"]): g for g in logged(log)}
    assert len(lines) == 1 + len(TP) + len(DP) + len(PP)  # one line per group, by its lowest rank
    assert lines[tuple(DP[0])] == {
        "ranks": DP[0],
        "backend": "undefined",
        "devices": {torch._C._get_accelerator().type: "fake"},
        "net": "IB",
        "applied": True,
    }
    tp = lines[tuple(TP[3])]
    assert tp["net"] is None and tp["applied"] is False and "node 3" in tp["why"] and "NVLink" in tp["why"]
    assert len(h.decisions) == 64 * (1 + len(TP) + len(DP) + len(PP))


def test_split_children_of_a_world_made_without_a_backend(fake_is_nccl):
    """split_group (DeviceMesh with a bound device) needs an accelerator to run: torch's own
    function is replaced by a recorder, the parent group and its "undefined" backend are real."""
    h, log = fake_is_nccl
    seen = []
    split = h.wrap_split(lambda **kw: seen.append(kw))
    for rank in (0, 9, 40):
        dist.init_process_group(rank=rank, world_size=64, store=FakeStore())
        for family in (TP, DP, PP):
            split(split_ranks=family, group_desc="split")
        dist.destroy_process_group()
    got = [kw["pg_options"].config.net_name if kw["pg_options"] is not None else None for kw in seen]
    assert got == [None, "IB", "Socket"] * 3
    lines = [g["ranks"] for g in logged(log) if g.get("desc") == "split"]
    assert lines == [TP[0], DP[0], PP[0], PP[9], TP[5]]  # each by its lowest rank


def test_the_device_map_not_the_backend_string_says_nccl():
    assert hook.device_backends("cpu:gloo,cuda:nccl") == {"cpu": "gloo", "cuda": "nccl"}
    assert set(hook.device_backends("gloo").values()) == {"gloo"}
    accelerator = torch._C._get_accelerator().type  # "cpu" here: undefined is gloo on this machine
    default = dist.Backend.default_device_backend_map[accelerator]
    assert hook.device_backends("undefined") == {accelerator: default}
    isl = Islands.from_layout(SIXTY_FOUR)
    assert hook.decide(isl, DP[0], {"cuda": "nccl"}, "nccl", False) == {"net": "IB", "applied": True}
    off = hook.decide(isl, DP[0], {"cpu": "gloo", "cuda": "gloo"}, "nccl", False)
    assert off["net"] == "IB" and not off["applied"] and "cpu:gloo,cuda:gloo" in off["why"]


def test_an_nccl_group_inside_one_node_gets_no_options():
    seen = []
    h = hook.NetHook(Islands.from_layout(THREE), log=io.StringIO(), new_options=FakeNcclOptions)
    helper = h.wrap_helper(lambda *a, **kw: seen.append(kw))
    helper(2, 0, [0, 1], "nccl", None, "tp", group_desc="tp")  # ranks 0, 1: node ib-0
    helper(2, 0, [0, 2], "nccl", None, "dp", group_desc="dp")
    assert "backend_options" not in seen[0] and seen[1]["backend_options"].config.net_name == "IB"
    assert [d["net"] for d in h.decisions] == [None, "IB"]


# ---- what would override the nets: NCCL_NET, TorchComms --------------------------------------


def test_nccl_net_in_a_nccl_conf_file_refuses_the_install(tmp_path):
    home, etc = tmp_path / "home", tmp_path / "etc" / "nccl.conf"
    home.mkdir()
    etc.parent.mkdir()
    etc.write_text("# site defaults\nNCCL_DEBUG=WARN\nNCCL_NET=IB\n")
    isl = Islands.from_layout(THREE)
    with pytest.raises(hook.HookError, match=rf"NCCL_NET=IB in {etc} would override.*HOLMES_NET_HOOK=off"):
        hook.install(isl, log=io.StringIO(), env={}, home=home, etc=etc)
    etc.write_text("NCCL_DEBUG=WARN\n#NCCL_NET=IB\nNCCL_NET =IB\n")  # NCCL sets neither
    (home / ".nccl.conf").write_text("NCCL_NET=Socket\n")
    with pytest.raises(hook.HookError, match=r"NCCL_NET=Socket in .*home/.nccl.conf.*NCCL_CONF_FILE"):
        hook.install(isl, log=io.StringIO(), env={}, home=home, etc=etc)
    mine = tmp_path / "mine.conf"  # NCCL_CONF_FILE replaces ~/.nccl.conf
    mine.write_text("NCCL_IB_TIMEOUT=22\n")
    env = {"NCCL_CONF_FILE": str(mine), "NCCL_NET": "IB"}
    log = io.StringIO()
    try:
        hook.install(isl, log=log, env=env, home=home, etc=etc)
    finally:
        hook.uninstall()
    assert "NCCL_NET" not in env and "removed NCCL_NET=IB" in log.getvalue()  # the env: removed


def test_a_refused_hook_stops_the_worker_instead_of_running_without_it(tmp_path):
    """Before: Python prints an exception raised in sitecustomize and runs the program anyway,
    without the hook, every group on the network NCCL_NET names."""
    dest = tmp_path / "holmes-launch"
    install_launcher(dest)
    (tmp_path / "layout.json").write_text(json.dumps(THREE))
    conf = tmp_path / "nccl.conf"
    conf.write_text("NCCL_NET=Socket\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("HOLMES_", "NCCL_"))},
        "PYTHONPATH": str(dest),
        "RANK": "3",
        "HOLMES_LAYOUT": str(tmp_path / "layout.json"),
        "NCCL_CONF_FILE": str(conf),
    }
    r = subprocess.run(
        [sys.executable, "-c", "print('the program ran')"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "the program ran" not in r.stdout, (r.returncode, r.stderr[-2000:])
    assert f"holmes network hook: rank 3: NCCL_NET=Socket in {conf}" in r.stderr


def test_torchcomms_is_refused_when_islands_need_two_nets_and_logged_as_not_applied():
    isl = Islands.from_layout(THREE)  # IB inside the islands, Socket across
    assert isl.nets_in_use() == {"IB", "Socket"}
    with pytest.raises(
        hook.HookError, match="TorchComms is on.*IB and Socket.*TORCH_DISTRIBUTED_USE_TORCHCOMMS"
    ):
        hook.install(isl, log=io.StringIO(), env={}, torchcomms=lambda: True)
    one = Islands.from_layout({**SIXTY_FOUR, "pipeline": 1, "data": 8, "stages": SIXTY_FOUR["stages"][:1]})
    assert one.nets_in_use() == {"IB"}
    log = io.StringIO()
    h = hook.install(one, log=log, env={}, torchcomms=lambda: True, new_options=FakeNcclOptions)
    try:
        seen = []
        helper = h.wrap_helper(lambda *a, **kw: seen.append(kw))
        helper(2, 0, [0, 8], "nccl", None, "dp")
    finally:
        hook.uninstall()
    assert "WARNING: TorchComms is on" in log.getvalue()
    assert "backend_options" not in seen[0]
    assert h.decisions[0]["applied"] is False and "TorchComms" in h.decisions[0]["why"]


def test_torchcomms_is_read_from_torchs_own_switch(monkeypatch):
    import torch.distributed.config as dist_config

    assert hook.torchcomms_enabled() is False  # torchcomms is not installed here
    # the config module's own patch: monkeypatch would delete the key on undo (it is no plain
    # attribute), and every later reader of the flag in this process would fail
    with dist_config.patch(use_torchcomms=True):
        assert hook.torchcomms_enabled() is False  # the flag alone: torch falls back to its backends
        monkeypatch.setattr(c10d, "_TORCHCOMM_AVAILABLE", True)  # as if the package were installed
        assert hook.torchcomms_enabled() is True
    assert dist_config.use_torchcomms is False
