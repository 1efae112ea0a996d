"""The replicas' outer group on NCCL (holmes.trainer.outer), checked without a GPU: the options
handed to ProcessGroupNCCL (recorded) and the exposed time of an overlapped exchange, timed on
the stream (fake CUDA events recording their calls)."""

from __future__ import annotations

import functools
from datetime import timedelta

import torch
from holmes_dev.ports import free_port

from holmes.contract.spec_sections import AcrossIslandsSpec
from holmes.trainer import outer


def test_the_outer_nccl_group_has_the_jobs_timeout_and_a_cta_cap(monkeypatch):
    """Before: default ProcessGroupNCCL.Options(): torch's 10 minutes whatever timeoutSeconds
    said, and no cap on the CTAs its kernel holds through every overlapped inner step."""
    built = []

    class Recorded:
        Options = torch.distributed.ProcessGroupNCCL.Options

        def __init__(self, store, rank, size, options):
            built.append((rank, size, options))

    monkeypatch.setattr(outer.dist, "ProcessGroupNCCL", Recorded)
    place = outer.ReplicaPlace(0, 1, "127.0.0.1", free_port("127.0.0.1"))
    group = outer.OuterGroup.connect(place, 0, 1, "nccl", timeout_s=5400.0)
    ((rank, size, options),) = built
    assert (rank, size) == (0, 1)
    assert options._timeout == timedelta(seconds=5400)
    assert options.config.net_name == outer.OUTER_NET
    assert options.config.max_ctas == 2
    assert group.stream_ordered  # settle() times it on the stream (below)


class Calls(list):
    pass


class FakeEvent:
    """torch.cuda.Event's surface, recording its calls; the second one ends 250 ms after the first."""

    made = 0

    def __init__(self, log: Calls, enable_timing: bool):
        assert enable_timing
        self.log, self.n = log, FakeEvent.made % 2
        FakeEvent.made += 1

    def record(self):
        self.log.append(f"record {self.n}")

    def synchronize(self):
        self.log.append(f"synchronize {self.n}")

    def elapsed_time(self, other):
        return 250.0


class FakeWork:
    def __init__(self, log: Calls):
        self.log = log

    def wait(self):
        self.log.append("wait")  # NCCL's: orders the stream, returns at once


class FakeOpt:
    def __init__(self):
        self.shard = torch.zeros(8)

    def masters(self):
        return [self.shard]

    def add_shard_state(self, name, tensors):
        pass

    def wait_param_gathers(self):
        pass

    def republish(self):
        pass


class StreamGroup(outer.OuterGroup):
    def __init__(self, log: Calls):
        super().__init__(None, 0, 1, stream_ordered=True)
        self.log = log

    def all_reduce_async(self, t):
        self.log.append("all_reduce")
        return FakeWork(self.log)


def test_settle_on_nccl_books_the_training_streams_stall():
    """Before: settle() timed work.wait() on the host, about 0 on NCCL (it only orders streams),
    so the exposed time went to the next iteration. Now an event on the stream either side of
    the wait; their distance is waitSeconds, read (one synchronize) when the exchange lands."""
    log = Calls()
    spec = AcrossIslandsSpec(mode="replicas", inner_steps=2, fragments=1, overlap_steps=1)
    sync = outer.OuterSync(FakeOpt(), spec, StreamGroup(log))
    assert sync.waiter is outer.stream_wait  # chosen from the group
    sync.waiter = functools.partial(outer.stream_wait, event=functools.partial(FakeEvent, log))
    FakeEvent.made = 0
    assert sync.after_step(2) is None  # sent
    sync.settle()  # before a checkpoint: waits on the stream, reads nothing
    assert log == ["all_reduce", "record 0", "wait", "record 1"]
    record = sync.after_step(3)  # lands
    assert log[-1] == "synchronize 1" and log.count("synchronize 1") == 1
    assert record is not None and record["waitSeconds"] == 0.25


def test_gloo_times_the_hosts_wait():
    spec = AcrossIslandsSpec(mode="replicas", inner_steps=2, fragments=1, overlap_steps=1)
    assert outer.OuterSync(FakeOpt(), spec, outer.LocalGroup()).waiter is outer.host_wait
