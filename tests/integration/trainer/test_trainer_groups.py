"""Every collective runs on a group the Layout declares (the world group, whose net is the
Layout's worldNet, or one built from its group families), pipeline traffic goes over the group
of its stage boundary, and the overlapped optimizer's all-gathers stay in flight until the next
forward. Recorded by wrapping torch.distributed in each forked gloo rank."""

from __future__ import annotations

import functools
import json

import torch
import torch.distributed as dist
from torch.distributed.pipelining import schedules

from holmes.contract import Layout
from holmes.contract.layout import GroupFamily
from holmes.trainer.config import OptimizerConfig
from holmes.trainer.engine import Trainer
from tests.helpers.trainer.trainer_harness import make_layout, run_ranks, tiny_config

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "barrier",
    "all_gather_single",
    "reduce_scatter_single",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
)
P2P = ("p2p",)


def _record(calls: list, name: str, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        calls.append((name, kwargs.get("group")))
        return fn(*args, **kwargs)

    return wrapper


def _record_p2p(calls: list):
    """The pipeline schedule issues every send/recv through one function: record each op's group."""
    real = schedules._batch_p2p

    def batch(ops, *args, **kwargs):
        calls.extend(("p2p", op.group) for op in ops)
        return real(ops, *args, **kwargs)

    schedules._batch_p2p = batch


def traced_training(rank: int, cfg, layout: Layout) -> dict:
    calls: list = []
    for name in COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, _record(calls, name, getattr(dist, name)))
    _record_p2p(calls)
    trainer = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo")
    trainer.train()
    g = trainer.groups
    declared = {id(h): kind for kind, h in (("dp", g.dp), ("embedding", g.embedding)) if h is not None}
    declared.update({id(h): f"p2p{b}" for b, h in g.p2p.items() if h is not None})
    declared[id(g.preemption)] = "preemption"  # the stop vote's gloo group (preempt.py)
    declared[id(trainer.checkpoint_group)] = "checkpoint"  # DCP's coordination, gloo too
    world = dist.group.WORLD
    used = []
    for name, group in calls:
        if group is None or group is world:
            used.append((name, "world"))
        else:
            used.append((name, declared.get(id(group), "UNDECLARED" if group is not g.pp else "pp")))
    return {"used": used, "start_groups": trainer.groups.created}


def test_every_collective_is_on_a_declared_group_and_p2p_on_its_boundary(tmp_path):
    cfg = tiny_config(
        optimizer=OptimizerConfig(kind="adamw", learning_rate=1e-3),
        iterations=2,
    )
    from holmes.trainer.config import CheckpointConfig

    cfg = cfg.with_(checkpoint=CheckpointConfig(str(tmp_path / "ckpt"), 1))
    lay = make_layout(3, 2, [2, 1, 1], 2, 4)  # 3 stages x 2 DP: a middle stage with two boundaries
    out = run_ranks(6, traced_training, cfg, lay, timeout=240)
    for rank, (_, res) in out.items():
        kinds = {k for _, k in res["used"]}
        assert "UNDECLARED" not in kinds, (rank, res["used"])
        assert "pp" not in kinds, f"rank {rank}: pipeline traffic on the pp group, not its boundary's"
        p2p_kinds = {k for n, k in res["used"] if n in P2P}
        stage = rank // 2
        want = {f"p2p{b}" for b in (stage - 1, stage) if 0 <= b < 2}
        assert p2p_kinds == want, (rank, p2p_kinds)
        control = {n for n, k in res["used"] if k == "world"}
        assert {"all_reduce", "broadcast"} <= control, control  # loss/norm, resume
        assert "barrier" not in control  # checkpoint coordination has a host group of its own
        assert "barrier" in {n for n, k in res["used"] if k == "checkpoint"}
        assert {n for n, k in res["used"] if k == "dp"} >= {"reduce_scatter_single", "all_gather_single"}
        # one stop vote per iteration on their own gloo group, nothing else there (the fabric
        # preflight's findings travel over the rendezvous store, on no group)
        assert [n for n, k in res["used"] if k == "preemption"] == ["all_reduce"] * 2
    created = out[2][1]["start_groups"]  # rank 2 = stage 1: world, dp, pp and both boundaries
    assert created[0] == {"kind": "world", "size": 6, "backend": "gloo", "net": "Socket"}
    assert created[-1] == {"kind": "preemption", "size": 6, "backend": "gloo", "net": "Socket"}
    assert sorted(g.get("boundary", -1) for g in created if g["kind"] == "p2p") == [0, 1]


def test_a_collective_on_an_undeclared_group_is_caught():
    """The recorder itself: a group built outside the Layout shows up as UNDECLARED."""

    def rogue(rank: int, cfg, layout: Layout) -> dict:
        res = traced_training(rank, cfg, layout)
        extra = dist.new_group([0, 1])
        calls: list = []
        _record(calls, "all_reduce", dist.all_reduce)(torch.ones(1), group=extra)
        return {"recorded": calls[0][1] is extra, "before": res["used"]}

    cfg = tiny_config(iterations=1)
    lay = make_layout(1, 2, [4], 2, 4)
    out = run_ranks(2, rogue, cfg, lay)
    assert all(v[1]["recorded"] for v in out.values())


def gather_waits(rank: int, cfg, layout: Layout) -> dict:
    """Where each all-gather launched by step() is waited on: inside the next forward (the
    schedule), never inside step() right after its launch."""
    phase = {"now": "setup"}
    events: list = []
    real = dist.all_gather_single

    def launch(*args, **kwargs):
        work = real(*args, **kwargs)
        events.append(("launch", phase["now"]))
        if work is None:
            return None

        class Traced:
            def wait(self, *a, **k):
                events.append(("wait", phase["now"]))
                return work.wait(*a, **k)

        return Traced()

    dist.all_gather_single = launch
    trainer = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo")
    step, run = trainer.opt.step, trainer.runner.run

    def in_phase(name, fn):
        def wrapped(*a, **k):
            phase["now"] = name
            try:
                return fn(*a, **k)
            finally:
                phase["now"] = "between"

        return wrapped

    trainer.opt.step, trainer.runner.run = in_phase("step", step), in_phase("forward", run)
    trainer.train()
    return {"events": events}


def test_all_gathers_are_waited_on_in_the_next_forward_not_after_launch():
    cfg = tiny_config(optimizer=OptimizerConfig(kind="adamw", learning_rate=1e-3), iterations=3)
    lay = make_layout(2, 2, [2, 2], 2, 4)
    out = run_ranks(4, gather_waits, cfg, lay)
    for rank, (_, res) in out.items():
        ev = res["events"]
        launches = [p for k, p in ev if k == "launch"]
        waits = [p for k, p in ev if k == "wait"]
        assert launches and set(launches) == {"step"}, (rank, ev)
        per_step = len(launches) // 3
        # iterations 1 and 2's gathers are waited on by the next forward; the last step's by
        # wait_param_gathers() when training ends; never inside step() right after launch
        assert waits[: 2 * per_step] == ["forward"] * (2 * per_step), f"rank {rank}: {ev}"
        assert "step" not in waits, f"rank {rank}: an all-gather was waited on inside step(): {ev}"


def test_the_layout_families_name_each_boundarys_net():
    lay = make_layout(3, 1, [2, 1, 1], 1, 3)
    assert [f for f in lay.groups if f.kind == "p2p"] == [
        GroupFamily("p2p", "Socket", 0),
        GroupFamily("p2p", "Socket", 1),
    ]


def test_every_group_the_engine_builds_is_logged_once_with_its_pinned_net(capsys):
    """Before: only rank 0's start line listed groups (its own), so the DP group of another
    stage never showed its network in any pod's log. Now each group's lowest rank writes the
    hook's ``holmesGroup`` line: the pinned net (null inside one node), applied on NCCL only."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from holmes.trainer.groups import LOG_KEY, build_groups

    layout = make_layout(2, 2, [2, 2], 1, 2, gpus_per_node=2, tensor=2)  # tp inside a node
    lines = []
    for rank in range(layout.world_size):
        dist.init_process_group("fake", rank=rank, world_size=layout.world_size, store=FakeStore())
        try:
            build_groups(layout, rank, "fake", 30, nets={(0, 2): "Socket"})  # the fabric check's move
        finally:
            dist.destroy_process_group()
        err = capsys.readouterr().err
        lines += [json.loads(x)[LOG_KEY] for x in err.splitlines() if x.startswith(f'{{"{LOG_KEY}"')]
    logged = {(g["kind"], tuple(g["ranks"])): g for g in lines}
    assert len(logged) == len(lines)  # once per group
    assert logged[("world", tuple(range(8)))]["net"] == "Socket"
    want = [g for g in layout.process_groups() if len(g.ranks) > 1]
    assert sorted(logged) == sorted([("world", tuple(range(8)))] + [(g.kind, g.ranks) for g in want])
    for g in want:
        entry = logged[(g.kind, g.ranks)]
        if g.kind == "tp":  # both ranks on one node: left to NCCL
            assert entry["net"] is None and "NVLink" in entry["why"], entry
        elif g.ranks == (0, 2):
            assert entry["net"] == "Socket" and entry["planned"] == "IB", entry
        else:
            assert entry["net"] == g.net and "planned" not in entry, entry
        assert entry["applied"] is False and entry["backend"] == "fake"
