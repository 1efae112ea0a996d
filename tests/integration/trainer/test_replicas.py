"""Replicas across islands (outer.py, DiLoCo): the schedule, parity with synchronous data
parallelism, where and when the outer collectives run, and a replica that rejoins."""

from dataclasses import replace

import pytest
import torch

from holmes.contract.spec_sections import AcrossIslandsSpec
from holmes.trainer import outer
from holmes.trainer.config import OptimizerConfig
from holmes.trainer.outer import ReplicaError, ReplicaPlace, fragment_due
from tests.helpers.trainer.replica_harness import replica_params, run_replica_ranks, train_replica
from tests.helpers.trainer.trainer_harness import (
    assert_params_close,
    make_layout,
    merged,
    run_ranks,
    tiny_config,
)
from tests.helpers.trainer.trainer_harness import train_on_layout as train_synchronous

SGD = OptimizerConfig(kind="sgd", learning_rate=0.5, weight_decay=0.0, grad_clip=0.0)


def replicas(**kw):
    return AcrossIslandsSpec(mode="replicas", **kw)


def test_each_fragment_is_due_once_per_inner_steps_in_turn():
    assert [fragment_due(i, 4, 1) for i in range(1, 9)] == [None, None, None, 0, None, None, None, 0]
    assert [fragment_due(i, 4, 2) for i in range(1, 9)] == [None, 0, None, 1, None, 0, None, 1]
    assert [fragment_due(i, 3, 3) for i in range(1, 7)] == [0, 1, 2, 0, 1, 2]


def test_the_replica_environment_is_all_or_nothing():
    assert ReplicaPlace.from_env({}) is None
    env = {"HOLMES_REPLICA": "1", "HOLMES_REPLICAS": "2", "HOLMES_OUTER_ADDR": "10.0.0.1:29600"}
    assert ReplicaPlace.from_env(env) == ReplicaPlace(1, 2, "10.0.0.1", 29600)
    with pytest.raises(ReplicaError, match="HOLMES_OUTER_ADDR not"):
        ReplicaPlace.from_env({"HOLMES_REPLICA": "0", "HOLMES_REPLICAS": "2"})
    with pytest.raises(ReplicaError, match=r"HOLMES_REPLICA=2 is not in \[0"):
        ReplicaPlace.from_env({**env, "HOLMES_REPLICA": "2"})


def test_one_replica_with_plain_averaging_is_synchronous_training():
    """One replica, outer lr 1 and no momentum: the outer step hands back the inner weights."""
    lay = make_layout(2, 2, [3, 1], 2, 4)
    plain = tiny_config(optimizer=SGD, iterations=4)
    one = plain.with_(across_islands=replicas(inner_steps=2, outer_learning_rate=1.0, outer_momentum=0.0))
    want_losses, want = merged(run_ranks(4, train_synchronous, plain, lay))
    got = run_replica_ranks(1, 4, train_replica, one, lay)
    assert got[(0, 0)]["losses"] == pytest.approx(want_losses, abs=1e-6)
    assert [o is not None for o in got[(0, 0)]["outer"]] == [False, True, False, True]
    assert got[(0, 0)]["outerStep"] == [0, 1, 1, 2]  # every line: the outer steps taken so far
    assert got[(0, 0)]["done"]["outerStep"] == 2  # and the last line, read once the pod ended
    assert_params_close(replica_params(got, 0), want, atol=1e-6)


def test_two_replicas_averaging_every_step_equal_synchronous_data_parallel():
    """SGD, H=1, outer lr 1, no momentum: the mean of the replicas' steps is the step on the mean
    gradient, so 2 replicas x DP 1 with 8 sequences each equal one world of DP 2 with 16."""
    sync = tiny_config(optimizer=SGD, iterations=4, global_batch_size=16)
    got_losses, want = merged(run_ranks(2, train_synchronous, sync, make_layout(1, 2, [4], 2, 4)))
    each = sync.with_(
        global_batch_size=8,
        across_islands=replicas(inner_steps=1, outer_learning_rate=1.0, outer_momentum=0.0),
    )
    got = run_replica_ranks(2, 1, train_replica, each, make_layout(1, 1, [4], 2, 4))
    for r in (0, 1):
        assert_params_close(replica_params(got, r), want, atol=2e-6)
    # each replica's loss is its half of the batch: their mean is the synchronous loss
    mean = [(a + b) / 2 for a, b in zip(got[(0, 0)]["losses"], got[(1, 0)]["losses"])]
    assert mean == pytest.approx(got_losses, abs=1e-5)


def recording_replica(rank, place, cfg, layout):
    """train_replica with every outer collective and every iteration's end noted in order."""
    events = []
    for name in ("all_reduce", "broadcast"):
        real = getattr(outer.OuterGroup, name)

        def record(self, t, *a, _real=real, _name=name, **k):
            events.append((_name, self.size, self.rank, t.numel(), str(t.dtype)))
            return _real(self, t, *a, **k)

        setattr(outer.OuterGroup, name, record)
    out = train_replica(rank, place, cfg, layout, lambda tr, rec: events.append(("iteration", tr.iteration)))
    out["events"] = events
    return out


def test_the_outer_all_reduce_runs_every_inner_steps_on_the_outer_group_only():
    cfg = tiny_config(iterations=6, global_batch_size=8).with_(
        across_islands=replicas(inner_steps=3, exchange_dtype="bfloat16")
    )
    lay = make_layout(2, 1, [2, 2], 2, 4)
    got = run_replica_ranks(2, 2, recording_replica, cfg, lay)
    for (r, _rank), out in got.items():
        ev = out["events"]
        join, rest = ev[0], ev[1:]
        assert join[:3] == ("all_reduce", 2, r) and join[4] == "torch.int64"  # who is furthest on
        exchanges = [e for e in rest if e[0] != "iteration"]
        assert all(e[:3] == ("all_reduce", 2, r) and e[4] == "torch.bfloat16" for e in exchanges)
        # after inner steps 3 and 6 (before that step's iteration line), never in between
        marks = [e[1] if e[0] == "iteration" else "outer" for e in rest]
        assert marks == [1, 2, "outer", 3, 4, 5, "outer", 6]
        # the rank's shard once: this stage's parameters, each padded to 128 elements
        numel = sum(p.numel() for p in out["params"].values())
        assert numel <= exchanges[0][3] < numel + 128 * (len(out["params"]) + 8)
        assert out["outer"][2]["bytes"] == exchanges[0][3] * 2
    # the replicas hold the same weights after an outer step, and they moved
    assert_params_close(replica_params(got, 0), replica_params(got, 1), atol=0)


def test_fragments_split_the_exchange_and_take_turns():
    cfg = tiny_config(iterations=4, global_batch_size=8).with_(
        across_islands=replicas(inner_steps=4, fragments=2)
    )
    got = run_replica_ranks(2, 1, recording_replica, cfg, make_layout(1, 1, [4], 2, 4))
    out = got[(0, 0)]
    marks = [e[1] if e[0] == "iteration" else e[3] for e in out["events"][1:]]
    half = [m for m in marks if not isinstance(m, int) or m > 100]
    assert [type(m) for m in marks[:3]] == [int, int, int] and len(half) == 2
    assert [o["fragment"] for o in out["outer"] if o] == [0, 1]
    total = sum(p.numel() for p in out["params"].values())
    assert abs(half[0] - half[1]) <= 1 and total <= sum(half) < total + 128 * (len(out["params"]) + 8)


def rejoining(rank, place, cfg, layout):
    """Replica 0 stands at iteration 3 with its own anchor; replica 1 starts fresh and joins."""
    from holmes.trainer.engine import Trainer, layout_signature

    t = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo", replica=place)
    if place.replica == 0:
        for a in t.outer.anchors:
            a.add_(0.25)
    iteration = t.outer.join(3 if place.replica == 0 else 0, layout_signature(layout))
    t.opt.wait_param_gathers()
    return {
        "iteration": iteration,
        "anchors": [a.clone() for a in t.outer.anchors],
        "masters": t.opt.masters(),
    }


def test_a_replica_behind_takes_the_weights_of_the_one_furthest_on():
    cfg = tiny_config(global_batch_size=8).with_(across_islands=replicas(inner_steps=3))
    got = run_replica_ranks(2, 1, rejoining, cfg, make_layout(1, 1, [4], 2, 4))
    ahead, behind = got[(0, 0)], got[(1, 0)]
    assert ahead["iteration"] == behind["iteration"] == 3
    for a, b, m in zip(ahead["anchors"], behind["anchors"], behind["masters"]):
        assert torch.equal(a, b) and torch.equal(b, m)


def mismatched(rank, place, cfg, layouts):
    return train_replica(rank, place, cfg, layouts[place.replica])


def test_replicas_with_different_layouts_are_refused_with_the_fix():
    cfg = tiny_config(global_batch_size=8).with_(across_islands=replicas(inner_steps=2))
    layouts = [make_layout(1, 1, [4], 2, 4), make_layout(1, 1, [4], 4, 2)]
    cfg2 = [cfg, replace(cfg, micro_batch_size=4)]
    with pytest.raises(AssertionError, match="plan them alike"):
        run_replica_ranks(
            2, 1, lambda rank, place: train_replica(rank, place, cfg2[place.replica], layouts[place.replica])
        )


def test_a_resumed_replica_continues_exactly_with_the_outer_state_from_its_checkpoint(tmp_path):
    """Stopped at iteration 3 (after the outer step at 2, mid-way to the one at 4) and resumed:
    the same weights as a run that never stopped, only if the anchor and the outer momentum were
    saved (a constant learning rate: a shorter run would otherwise decay on another schedule)."""
    from holmes.trainer.config import CheckpointConfig

    lay = make_layout(1, 1, [4], 2, 4)
    constant = OptimizerConfig(kind="adamw", learning_rate=1e-3, decay="constant", warmup_iterations=0)
    base = tiny_config(global_batch_size=8, iterations=6, optimizer=constant).with_(
        across_islands=replicas(inner_steps=2, outer_momentum=0.9),
        checkpoint=CheckpointConfig(path=str(tmp_path / "a"), interval_iterations=3, asynchronous=False),
    )
    other = base.with_(checkpoint=replace(base.checkpoint, path=str(tmp_path / "b")))
    whole = run_replica_ranks(2, 1, train_replica, other, lay)
    run_replica_ranks(2, 1, train_replica, base.with_(iterations=3), lay)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["replica-0", "replica-1"]
    resumed = run_replica_ranks(2, 1, train_replica, base, lay)
    assert resumed[(0, 0)]["losses"] == pytest.approx(whole[(0, 0)]["losses"][3:], abs=1e-6)
    for r in (0, 1):
        assert_params_close(replica_params(resumed, r), replica_params(whole, r), atol=1e-6)


def test_the_mode_and_the_launchers_replica_variables_must_agree():
    from holmes.trainer.engine import replicas_of

    place = ReplicaPlace(1, 2, "h", 1)
    assert replicas_of(tiny_config(), None) is None
    assert replicas_of(tiny_config(across_islands=replicas()), None) == ReplicaPlace(0, 1, "", 0)
    assert replicas_of(tiny_config(across_islands=AcrossIslandsSpec(mode="auto")), None) is None
    assert replicas_of(tiny_config(across_islands=AcrossIslandsSpec(mode="auto")), place) == place
    with pytest.raises(ReplicaError, match="mode is pipeline: set mode replicas"):
        replicas_of(tiny_config(), place)
