"""Replicas with the exchange overlapped (acrossIslands.overlapSteps, Streaming DiLoCo's tau):
the delayed rule against a hand-written reference, when the outer all-reduce is issued and
waited for, and an exact resume from a checkpoint taken while an exchange was in flight."""

import json
from dataclasses import replace

import pytest
import torch

from holmes.contract.spec_sections import AcrossIslandsSpec
from holmes.trainer import outer
from holmes.trainer.config import CheckpointConfig, OptimizerConfig
from holmes.trainer.engine import Trainer
from tests.helpers.trainer.replica_harness import replica_params, run_replica_ranks, train_replica
from tests.helpers.trainer.trainer_harness import assert_params_close, make_layout, tiny_config


def overlapped(**kw):
    return AcrossIslandsSpec(mode="replicas", **kw)


def by_hand(rank, place, cfg, layout):
    """The delayed rule written out: the trainer's inner steps only (its outer optimizer taken
    away), each fragment's mean change taken and exchanged (blocking) when it is due, and only
    overlapSteps steps later the outer Nesterov step on it and the half-and-half mix."""
    trainer = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo", replica=place)
    group, trainer.outer = trainer.outer.group, None
    a = cfg.across_islands
    every, tau, lr, mu = (
        a.inner_steps // a.fragments,
        a.overlap_steps,
        a.outer_learning_rate,
        a.outer_momentum,
    )
    masters = trainer.opt.masters()
    anchor = [m.clone() for m in masters]
    momentum = [torch.zeros_like(m) for m in masters]

    def part(t, f):  # fragment f: the f-th of F near-equal slices of a shard
        n = t.numel()
        return t[n * f // a.fragments : n * (f + 1) // a.fragments]

    losses, landing = [], {}  # apply_at -> (fragment, mean change per shard as of when it was sent)
    for i in range(1, cfg.iterations + 1):
        losses.append(trainer.train_step()["loss"])
        trainer.opt.wait_param_gathers()
        if i in landing:
            f, deltas = landing.pop(i)
            for w, g, b, d in zip(masters, anchor, momentum, deltas):
                part(b, f).copy_(mu * part(b, f) + d)
                part(g, f).copy_(part(g, f) - lr * (d + mu * part(b, f)))
                part(w, f).copy_(0.5 * part(w, f) + 0.5 * part(g, f))
            trainer.opt.republish()
        if i % every == 0:
            f = (i // every - 1) % a.fragments
            deltas = []
            for w, g in zip(masters, anchor):
                d = (part(g, f) - part(w, f)).clone()
                group.all_reduce(d)
                deltas.append(d / group.size)
            landing[i + tau] = (f, deltas)
    trainer.opt.wait_param_gathers()
    params = {}
    if trainer.info.dp_index == 0:
        params = {k: v.detach().clone() for k, v in trainer.module.state_dict().items()}
    return {"losses": losses, "params": params}


@pytest.mark.parametrize(
    ("inner_steps", "fragments", "overlap_steps"),
    [(3, 1, 2), (4, 2, 2)],  # tau < H; and tau = H/F: a fragment lands as the next one leaves
)
def test_the_overlapped_exchange_follows_the_delayed_rule(inner_steps, fragments, overlap_steps):
    cfg = tiny_config(iterations=8, global_batch_size=8).with_(
        across_islands=overlapped(inner_steps=inner_steps, fragments=fragments, overlap_steps=overlap_steps)
    )
    lay = make_layout(2, 1, [2, 2], 2, 4)  # two stages per replica: each rank its own shard
    got = run_replica_ranks(2, 2, train_replica, cfg, lay)
    want = run_replica_ranks(2, 2, by_hand, cfg, lay)
    for r in (0, 1):
        assert got[(r, 0)]["losses"] == pytest.approx(want[(r, 0)]["losses"], abs=1e-6)
        assert_params_close(replica_params(got, r), replica_params(want, r), atol=1e-6)
    # not the synchronous rule by another name: the replicas keep their own half, and differ
    sync = run_replica_ranks(
        2, 2, train_replica, cfg.with_(across_islands=overlapped(inner_steps=inner_steps)), lay
    )
    assert got[(0, 0)]["losses"][-1] != pytest.approx(sync[(0, 0)]["losses"][-1], abs=1e-4)
    diff = max((replica_params(got, 0)[k] - v).abs().max() for k, v in replica_params(got, 1).items())
    assert diff > 1e-4
    applied = [o for o in got[(0, 0)]["outer"] if o]
    assert [(o["iteration"], o["appliedAt"]) for o in applied][:2] == [
        (inner_steps // fragments, inner_steps // fragments + overlap_steps),
        (2 * inner_steps // fragments, 2 * inner_steps // fragments + overlap_steps),
    ]


def recording_replica(rank, place, cfg, layout):
    """train_replica with every outer collective, its wait, and every iteration's end in order."""
    events = []

    def record(name, real):
        def call(self, t, *a, **k):
            events.append((name, self.size, self.rank, str(t.dtype)))
            return real(self, t, *a, **k)

        return call

    issue = outer.OuterGroup.all_reduce_async

    def issue_and_note_wait(self, t):
        events.append(("issue", self.size, self.rank, str(t.dtype)))
        work = issue(self, t)
        wait = work.wait
        return type("Noted", (), {"wait": lambda _self: (events.append(("wait",)), wait())[1]})()

    outer.OuterGroup.all_reduce = record("all_reduce", outer.OuterGroup.all_reduce)
    outer.OuterGroup.broadcast = record("broadcast", outer.OuterGroup.broadcast)
    outer.OuterGroup.all_reduce_async = issue_and_note_wait
    out = train_replica(rank, place, cfg, layout, lambda tr, rec: events.append(("iteration", tr.iteration)))
    out["events"] = events
    return out


def test_the_outer_all_reduce_is_issued_before_the_steps_it_overlaps_and_waited_after_them():
    cfg = tiny_config(iterations=8, global_batch_size=8).with_(
        across_islands=overlapped(inner_steps=4, overlap_steps=2, exchange_dtype="bfloat16")
    )
    got = run_replica_ranks(2, 2, recording_replica, cfg, make_layout(2, 1, [2, 2], 2, 4))
    for (r, _rank), out in got.items():
        join, *rest = out["events"]
        assert join == ("all_reduce", 2, r, "torch.int64")  # who is furthest on: the only blocking one
        marks = [e[1] if e[0] == "iteration" else e[0] for e in rest]
        # sent after step 4 (before its line), steps 5 and 6 run while it travels, waited after 6;
        # the one sent after step 8 is waited for before the rank leaves (the others need it)
        assert marks == [1, 2, 3, "issue", 4, 5, "wait", 6, 7, "issue", 8, "wait"]
        issued = [e for e in rest if e[0] == "issue"]
        assert issued == [("issue", 2, r, "torch.bfloat16")] * 2  # on the outer group of 2 replicas


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_checkpoint_taken_mid_exchange_resumes_exactly(tmp_path, asynchronous):
    """Sent after step 4, due after step 6, the checkpoint at 5 falls in between: it holds the
    outer step taken early and the mix still due, so stopping at 5 and resuming ends where a
    run that never saved (and waited at 6) does."""
    lay = make_layout(1, 1, [4], 2, 4)
    constant = OptimizerConfig(kind="adamw", learning_rate=1e-3, decay="constant", warmup_iterations=0)
    base = tiny_config(global_batch_size=8, iterations=8, optimizer=constant).with_(
        across_islands=overlapped(inner_steps=4, overlap_steps=2, outer_momentum=0.9),
        checkpoint=CheckpointConfig(
            path=str(tmp_path / "a"), interval_iterations=5, asynchronous=asynchronous
        ),
    )
    unsaved = base.with_(checkpoint=CheckpointConfig(path=None))
    whole = run_replica_ranks(2, 1, train_replica, unsaved, lay)
    run_replica_ranks(2, 1, train_replica, base.with_(iterations=5), lay)
    marker = json.loads((tmp_path / "a" / "replica-0" / "iter_00000005" / "holmes.json").read_text())
    assert marker["outerInFlight"] == {"fragment": 0, "sentAt": 4, "applyAt": 6}
    resumed = run_replica_ranks(2, 1, train_replica, base, lay)
    assert resumed[(0, 0)]["losses"] == pytest.approx(whole[(0, 0)]["losses"][5:], abs=1e-6)
    for r in (0, 1):
        assert_params_close(replica_params(resumed, r), replica_params(whole, r), atol=1e-6)


def test_overlap_beyond_one_exchange_in_flight_is_refused_naming_the_field():
    spec = replace(overlapped(inner_steps=4, fragments=2), overlap_steps=3)
    with pytest.raises(outer.ReplicaError, match="overlapSteps 3 exceeds innerSteps / fragments = 2"):
        outer.OuterSync(type("Opt", (), {"masters": lambda self: []})(), spec, outer.LocalGroup())


def rejoining(rank, place, cfg, layout):
    """Replica 0 stands at iteration 5 with a settled exchange whose mix is due after step 6;
    replica 1 starts fresh and joins."""
    from holmes.trainer.engine import layout_signature

    t = Trainer(cfg, layout, rank=rank, device=torch.device("cpu"), backend="gloo", replica=place)
    if place.replica == 0:
        t.outer.resume({"outerInFlight": {"fragment": 1, "sentAt": 4, "applyAt": 6}})
    iteration = t.outer.join(5 if place.replica == 0 else 0, layout_signature(layout))
    f = t.outer.in_flight
    return {
        "iteration": iteration,
        "due": None if f is None else (f.fragment, f.sent_at, f.apply_at, f.settled),
    }


def test_a_replica_behind_takes_the_mix_still_due_from_the_one_furthest_on():
    cfg = tiny_config(global_batch_size=8).with_(
        across_islands=overlapped(inner_steps=4, fragments=2, overlap_steps=2)
    )
    got = run_replica_ranks(2, 1, rejoining, cfg, make_layout(1, 1, [4], 2, 4))
    assert got[(0, 0)] == got[(1, 0)] == {"iteration": 5, "due": (1, 4, 6, True)}
