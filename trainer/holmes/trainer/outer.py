"""Replicas across islands (``spec.training.acrossIslands.mode: replicas``): DiLoCo, written here.

Each replica is a world of its own (its Layout: pipeline, data, tensor parallel inside one island)
and trains with the job's inner optimizer. Every ``innerSteps`` steps the replicas average the
change of their weights since the last synchronization (the "outer gradient") over the outer
group and apply it with an outer Nesterov step (Douillard et al., arXiv 2311.08105):

    delta  = anchor - mean_over_replicas(weights)
    buf    = momentum * buf + delta
    anchor = anchor - outer_lr * (delta + momentum * buf)   (plain delta without momentum)
    weights = anchor

The operand is the distributed optimizer's fp32 master shard: DP rank d of a replica owns 1/D of
every bucket, and so does DP rank d of every other replica (the Layouts are the same), so the
outer group of rank r is {rank r of every replica} and a replica sends its model once over the
slow link however large D is. ``fragments`` splits every shard into that many slices and
synchronizes one every innerSteps/fragments steps (Streaming DiLoCo, arXiv 2501.18512; not
overlapped with compute here); ``exchangeDtype`` bfloat16 sends the deltas in half the bytes.

The anchor and the momentum live beside the inner optimizer's state (``outerAnchor``,
``outerMomentum`` in ``shard_states``), so checkpoints hold them under global names and reshard
them like the moments. On start every replica says how far it got; when they differ, the
replica furthest on (the lowest-numbered among equals) sends its anchor, momentum and iteration
to the others: a replica that rejoins takes the others' weights.

The outer group is a process group outside the replica's world (each replica has its own
rendezvous): a TCPStore that replica 0's rank 0 serves at ``HOLMES_OUTER_ADDR``, one prefix per
rank index. On NCCL it is pinned to the Socket network (the slow link), as Holmes pins its
cross-island groups.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from holmes.contract.jobspec import AcrossIslandsSpec
from holmes.contract.names import ENV_OUTER_ADDR, ENV_REPLICA, ENV_REPLICAS

OUTER_NET = "Socket"  # the slow link between islands: no RDMA fabric spans it


class ReplicaError(ValueError):
    """The replica environment is incomplete or inconsistent: the message names the variable."""


@dataclass(frozen=True)
class ReplicaPlace:
    """Where this process's replica sits among the replicas, and where the outer group meets."""

    replica: int
    replicas: int
    host: str
    port: int

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ReplicaPlace | None:
        """From HOLMES_REPLICA, HOLMES_REPLICAS and HOLMES_OUTER_ADDR; None when none is set."""
        names = (ENV_REPLICA, ENV_REPLICAS, ENV_OUTER_ADDR)
        given = [n for n in names if env.get(n)]
        if not given:
            return None
        missing = [n for n in names if n not in given]
        if missing:
            raise ReplicaError(f"{', '.join(given)} set but {', '.join(missing)} not: set all three or none")
        host, _, port = env[ENV_OUTER_ADDR].rpartition(":")
        if not host or not port.isdigit():
            raise ReplicaError(f"{ENV_OUTER_ADDR}={env[ENV_OUTER_ADDR]!r} is not host:port")
        try:
            replica, replicas = int(env[ENV_REPLICA]), int(env[ENV_REPLICAS])
        except ValueError:
            raise ReplicaError(f"{ENV_REPLICA} and {ENV_REPLICAS} must be integers") from None
        if not 0 <= replica < replicas:
            raise ReplicaError(f"{ENV_REPLICA}={replica} is not in [0, {ENV_REPLICAS}={replicas})")
        return cls(replica, replicas, host.strip("[]"), int(port))


def fragment_due(iteration: int, inner_steps: int, fragments: int) -> int | None:
    """The fragment to synchronize after ``iteration`` (1-based) inner steps, or None: fragment f
    every inner_steps steps, at offsets (f + 1) * inner_steps / fragments."""
    every = inner_steps // fragments
    if iteration <= 0 or iteration % every:
        return None
    return (iteration // every - 1) % fragments


class OuterGroup:
    """A process group over the same rank of every replica: what the outer step needs of it."""

    def __init__(self, pg: Any, rank: int, size: int):
        self.pg, self.rank, self.size = pg, rank, size
        self.store: Any = None

    @classmethod
    def connect(
        cls, place: ReplicaPlace, local_rank: int, local_world: int, backend: str, timeout_s: float
    ) -> OuterGroup:
        """Collective over the replicas: rank ``local_rank`` of this replica joins its outer group."""
        timeout = timedelta(seconds=timeout_s)
        is_server = place.replica == 0 and local_rank == 0
        store = dist.TCPStore(
            place.host, place.port, place.replicas * local_world, is_server, timeout, wait_for_workers=False
        )
        prefixed = dist.PrefixStore(f"holmes-outer/{local_rank}", store)
        if backend == "nccl":
            from .groups import group_options

            options = group_options("nccl", OUTER_NET)
            pg = dist.ProcessGroupNCCL(prefixed, place.replica, place.replicas, options)
        else:
            pg = dist.ProcessGroupGloo(prefixed, place.replica, place.replicas, timeout)
        group = cls(pg, place.replica, place.replicas)
        group.store = store  # the server must outlive every client's use of it
        return group

    def all_reduce(self, t: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        self.pg.allreduce([t], opts).wait()

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        self.pg.broadcast([t], opts).wait()


class LocalGroup(OuterGroup):
    """One replica: the outer step runs on its own weights, nothing crosses a link."""

    def __init__(self) -> None:
        super().__init__(None, 0, 1)

    def all_reduce(self, t: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> None:
        return None

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        return None


def fingerprint(signature: Mapping[str, Any]) -> int:
    """A 62-bit digest of a replica's layout signature, equal across replicas that can pair."""
    text = json.dumps(signature, sort_keys=True).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 2


class OuterSync:
    """The outer optimizer of one rank: its anchor and momentum per bucket shard, its fragments."""

    def __init__(self, opt: Any, spec: AcrossIslandsSpec, group: OuterGroup):
        self.opt, self.spec, self.group = opt, spec, group
        self.exchange_dtype = getattr(torch, spec.exchange_dtype)
        self.masters: list[torch.Tensor] = opt.masters()
        self.anchors = [m.detach().clone() for m in self.masters]
        self.momenta = [torch.zeros_like(m) for m in self.masters] if spec.outer_momentum > 0 else []
        opt.add_shard_state("outerAnchor", self.anchors)
        if self.momenta:
            opt.add_shard_state("outerMomentum", self.momenta)
        F = spec.fragments
        # fragment f: the f-th of F near-equal slices of every shard (balanced whatever the buckets)
        self.slices = [[_slice(m.numel(), f, F) for m in self.masters] for f in range(F)]
        self.outer_steps = 0
        self.last: dict[str, Any] | None = None

    def after_step(self, iteration: int) -> dict[str, Any] | None:
        """After inner step ``iteration`` (1-based): synchronize the fragment due, if one is."""
        f = fragment_due(iteration, self.spec.inner_steps, self.spec.fragments)
        if f is None:
            return None
        return self.sync(f, iteration)

    def sync(self, fragment: int, iteration: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.opt.wait_param_gathers()  # the step's all-gathers read the masters we now change
        sl = self.slices[fragment]
        flat = torch.cat([(a[s] - m[s]).flatten() for a, m, s in zip(self.anchors, self.masters, sl)])
        wire = flat.to(self.exchange_dtype)
        self.group.all_reduce(wire)
        delta = wire.to(torch.float32).div_(self.group.size)
        lr, mu = self.spec.outer_learning_rate, self.spec.outer_momentum
        at = 0
        for k, (a, m, s) in enumerate(zip(self.anchors, self.masters, sl)):
            n = s.stop - s.start
            d = delta[at : at + n]
            at += n
            if mu > 0:
                buf = self.momenta[k][s]
                buf.mul_(mu).add_(d)
                d = d.add(buf, alpha=mu)  # Nesterov
            a[s].sub_(d, alpha=lr)
            m[s].copy_(a[s])
        self.opt.republish()  # the replica's parameters from the new masters
        self.outer_steps += 1
        self.last = {
            "outerStep": self.outer_steps,
            "fragment": fragment,
            "iteration": iteration,
            "bytes": wire.numel() * wire.element_size(),
            "seconds": time.perf_counter() - t0,
        }
        return self.last

    def join(self, iteration: int, signature: Mapping[str, Any]) -> int:
        """Collective over the replicas at start (after any resume): the iteration to go on from.
        When the replicas stand at different iterations, the one furthest on (lowest replica among
        equals) sends its anchor, momentum and iteration; the others take them as their weights.
        Replicas must run the same layout (``signature``): their shards pair rank by rank."""
        R, r = self.group.size, self.group.rank
        fp = fingerprint(signature)
        key = torch.tensor([iteration * R + (R - 1 - r), -iteration, fp, -fp], dtype=torch.int64)
        self.group.all_reduce(key, dist.ReduceOp.MAX)
        if int(key[2]) != -int(key[3]):
            raise ReplicaError(
                f"replica {r} runs layout {dict(signature)} and another replica a different one: "
                "replicas pair their optimizer shards rank by rank, so every replica needs the same "
                "pipeline, data, tensor, stage split and micro-batches; plan them alike"
            )
        best, lowest = int(key[0]), -int(key[1])
        source, newest = R - 1 - best % R, best // R
        every = self.spec.inner_steps // self.spec.fragments
        self.outer_steps = newest // every
        if newest == lowest:
            return iteration
        self.opt.wait_param_gathers()
        for t in self.anchors + self.momenta:
            self.group.broadcast(t, source)
        for a, m in zip(self.anchors, self.masters):
            m.copy_(a)
        self.opt.republish()
        return newest


def _slice(n: int, f: int, fragments: int) -> slice:
    return slice(n * f // fragments, n * (f + 1) // fragments)
