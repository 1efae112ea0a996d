"""torch 2.13's _batch_p2p issues all-send and all-recv batches op by op, which ProcessGroupNCCL
runs on a 2-rank communicator keyed by the pair, not the group's own: the fabric preflight
creates and times it (recorded calls), the dry run counts it (recorded collectives, marked
batched or not) and so does the planner."""

from __future__ import annotations

import torch
import torch.distributed as dist

from holmes.plan.costmodel import P2P_COMMUNICATORS
from holmes.trainer import fabric
from holmes.trainer.dryrun.recording import Collective, Recorder, device_communicators

P2P = {"kind": "p2p", "size": 2, "net": "IB", "boundary": 0}
DP = {"kind": "dp", "size": 4, "net": "IB"}


def test_torch_2_13_sends_homogeneous_batches_op_by_op_outside_batch_isend_irecv():
    """What the rest rests on: the installed torch's _batch_p2p (pipelining/schedules.py)."""
    import inspect

    from torch.distributed.pipelining import schedules

    src = inspect.getsource(schedules._batch_p2p)
    assert "op_types == {dist.isend}" in src and "op_types == {dist.irecv}" in src
    assert src.rstrip().endswith("return dist.batch_isend_irecv(p2p_ops)")


def test_the_preflight_creates_and_times_each_p2p_pairs_communicator(monkeypatch):
    """Before: one all-reduce per group only; the pair's communicator, on which every schedule's
    all-send or all-recv batches run, was created blocking in step 1, never checked or timed."""
    calls: list[tuple] = []

    class Done:
        def wait(self):
            return True

    def record(name):
        def op(*args, **kwargs):
            calls.append((name, kwargs.get("group"), kwargs.get("group_dst", kwargs.get("group_src"))))
            return Done()

        return op

    monkeypatch.setattr(dist, "all_reduce", record("all_reduce"))
    monkeypatch.setattr(dist, "isend", record("isend"))
    monkeypatch.setattr(dist, "irecv", record("irecv"))
    monkeypatch.setattr(dist, "batch_isend_irecv", record("batch_isend_irecv"))
    ranks = {"p2p-low": 0, "p2p-high": 1, "dp": 2}
    monkeypatch.setattr(dist, "get_rank", lambda group=None: ranks[group])
    seconds: dict[str, float] = {}
    pairs = [(DP, "dp"), (P2P, "p2p-low"), ({**P2P, "boundary": 1}, "p2p-high")]
    failed, stuck = fabric.probe_groups(pairs, torch.device("cpu"), 5.0, bounded=False, seconds=seconds)
    assert failed == [] and stuck is None
    assert calls == [
        ("all_reduce", "dp", None),
        ("all_reduce", "p2p-low", None),
        ("isend", "p2p-low", 1),  # group rank 0 sends to 1, alone
        ("all_reduce", "p2p-high", None),
        ("irecv", "p2p-high", 0),
    ]
    assert set(seconds) == {
        "dp group (4 ranks)",
        "p2p group of boundary 0",
        "p2p group of boundary 0 send/recv",
        "p2p group of boundary 1",
        "p2p group of boundary 1 send/recv",
    }
    report = fabric.FabricReport("fail", "checked", "checked", [], seconds=seconds)
    assert "p2p group of boundary 0 send/recv" in report.summary()["groupSeconds"]


def test_the_dry_run_counts_a_pair_communicator_for_lone_sends_on_a_two_rank_group():
    """Before: a pair communicator only on groups of more than two ranks; a p2p group (two
    ranks) was one communicator whatever torch sent on it."""
    kinds = {"p2p-0": P2P}
    lone = Collective((0, 1), "send", "bfloat16", 64, peer=1, name="p2p-0")
    batched = Collective((0, 1), "recv_", "bfloat16", 64, peer=1, name="p2p-0", batched=True)
    probe = Collective((0, 1), "allreduce_", "float32", 4, name="p2p-0")
    both = device_communicators(kinds, "world", "IB", [probe, batched, lone])
    assert [c["kind"] for c in both] == ["p2p", "p2p pair"]
    assert len(both) == P2P_COMMUNICATORS  # the planner's count per p2p group
    only_batched = device_communicators(kinds, "world", "IB", [probe, batched])
    assert [c["kind"] for c in only_batched] == ["p2p"]


def test_the_recorder_marks_what_batch_isend_irecv_issues(monkeypatch):
    import torch.distributed.distributed_c10d as c10d

    rec = Recorder()
    seen = []
    monkeypatch.setattr(c10d, "batch_isend_irecv", lambda ops: seen.append(rec._batching) or [])
    real = c10d.batch_isend_irecv
    with rec.batched_p2p():
        assert dist.batch_isend_irecv is c10d.batch_isend_irecv is not real
        dist.batch_isend_irecv([])
    assert seen == [1] and rec._batching == 0 and c10d.batch_isend_irecv is real
