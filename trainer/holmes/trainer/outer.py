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
synchronizes one every innerSteps/fragments steps (Streaming DiLoCo, arXiv 2501.18512);
``exchangeDtype`` bfloat16 sends the deltas in half the bytes; ``overlapSteps`` (tau) overlaps
each exchange with the next tau inner steps (OuterSync's docstring has the delayed rule).

The anchor and the momentum live beside the inner optimizer's state (``outerAnchor``,
``outerMomentum`` in ``shard_states``), so checkpoints hold them under global names and reshard
them like the moments. On start every replica says how far it got; when they differ, the
replica furthest on (the lowest-numbered among equals) sends its anchor, momentum and iteration
to the others: a replica that rejoins takes the others' weights.

The outer group is a process group outside the replica's world (each replica has its own
rendezvous): a TCPStore that replica 0's rank 0 serves at ``HOLMES_OUTER_ADDR``, one prefix per
rank index. On NCCL it is pinned to the Socket network (the slow link), as Holmes pins its
cross-island groups, with the job's ``timeoutSeconds`` (built directly, it would otherwise get
torch's 10 minutes, which a slow exchange can outlast) and its kernel capped at
:data:`OUTER_MAX_CTAS` CTAs: an overlapped exchange's kernel holds its SMs, spinning on the link,
through every inner step it overlaps.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from holmes.contract.names import ENV_OUTER_ADDR, ENV_REPLICA, ENV_REPLICAS
from holmes.contract.spec_sections import AcrossIslandsSpec

OUTER_NET = "Socket"  # the slow link between islands: no RDMA fabric spans it
# Streaming DiLoCo's mixing factor alpha: when an overlapped exchange lands, a fragment's weights
# become alpha * (the replica's own, trained on meanwhile) + (1 - alpha) * (the outer step's)
OVERLAP_MIX = 0.5
# NCCL's maxCTAs (ncclConfig_t, torch's ProcessGroupNCCL.Options.config.max_ctas) for the outer
# group: one CTA per channel, each spinning on an SM while the Socket transport moves bytes; two
# channels keep a TCP link of a few Gb/s busy (NCCL's socket proxy threads, not SMs, carry the
# bytes). Unmeasured on a GPU: the SMs it frees and the bandwidth it keeps are unproven on CPU.
OUTER_MAX_CTAS = 2


def outer_options(timeout_s: float) -> Any:
    """The outer group's ProcessGroupNCCL options: the Socket network, the job's timeout (the
    options' own, which ProcessGroupNCCL's watchdog uses; init_process_group and new_group set
    it from their ``timeout``, a group built directly keeps torch's 10-minute default) and the
    CTA cap (:data:`OUTER_MAX_CTAS`)."""
    from .groups import group_options

    options = group_options("nccl", OUTER_NET)
    options._timeout = timedelta(seconds=timeout_s)
    options.config.max_ctas = OUTER_MAX_CTAS
    return options


def host_wait(work: Any) -> Callable[[], float]:
    """Wait for ``work`` where wait() blocks the host (gloo): the seconds it took."""
    t0 = time.perf_counter()
    work.wait()
    seconds = time.perf_counter() - t0
    return lambda: seconds


def stream_wait(work: Any, event: Any = None) -> Callable[[], float]:
    """Wait for ``work`` on CUDA, where wait() only makes the current stream wait for NCCL's
    (the host returns at once, so timing the call measures about 0): an event on the current
    stream before and after the wait, whose distance is how long the training stream stood still
    for the link. The returned reader synchronizes the second event, so call it only when the
    figure is wanted (once per applied exchange)."""
    event = event if event is not None else torch.cuda.Event
    start, end = event(enable_timing=True), event(enable_timing=True)
    start.record()
    work.wait()
    end.record()

    def seconds() -> float:
        end.synchronize()
        return float(start.elapsed_time(end)) / 1000.0

    return seconds


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

    def __init__(self, pg: Any, rank: int, size: int, stream_ordered: bool = False):
        self.pg, self.rank, self.size = pg, rank, size
        self.store: Any = None
        # NCCL: a work's wait() orders the current stream after it and returns at once
        self.stream_ordered = stream_ordered

    @classmethod
    def connect(
        cls, place: ReplicaPlace, local_rank: int, local_world: int, backend: str, timeout_s: float
    ) -> OuterGroup:
        """Collective over the replicas: rank ``local_rank`` of this replica joins its outer group."""
        if backend == "fake":  # the dry run (holmes.trainer.dryrun): no store, no peers
            return cls.fake(place, local_rank)
        timeout = timedelta(seconds=timeout_s)
        is_server = place.replica == 0 and local_rank == 0
        store = dist.TCPStore(
            place.host, place.port, place.replicas * local_world, is_server, timeout, wait_for_workers=False
        )
        prefixed = dist.PrefixStore(f"holmes-outer/{local_rank}", store)
        if backend == "nccl":
            pg = dist.ProcessGroupNCCL(prefixed, place.replica, place.replicas, outer_options(timeout_s))
        else:
            pg = dist.ProcessGroupGloo(prefixed, place.replica, place.replicas, timeout)
        group = cls(pg, place.replica, place.replicas, stream_ordered=backend == "nccl")
        group.store = store  # the server must outlive every client's use of it
        return group

    @classmethod
    def fake(cls, place: ReplicaPlace, local_rank: int) -> OuterGroup:
        """The outer group of the dry run: torch's fake backend (every collective returns at
        once, moving nothing) as replica ``place.replica`` of ``place.replicas``. It sits in a
        ProcessGroup, so its collectives go through the c10d operators the dry run's recorder
        sees; connect's real backends are called directly, with the same methods and options."""
        from torch._C._distributed_c10d import FakeProcessGroup

        backend = FakeProcessGroup._create_internal(place.replica, place.replicas)
        pg = dist.ProcessGroup(dist.HashStore(), place.replica, place.replicas)
        for device in ("cpu", "cuda"):  # the recorder, not the fake, judges where tensors are
            pg._register_backend(torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, backend)
        pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        pg._set_group_name(f"holmes-outer/{local_rank}")
        return cls(pg, place.replica, place.replicas)

    def all_reduce(self, t: torch.Tensor, op: Any = dist.ReduceOp.SUM) -> None:
        opts = dist.AllreduceOptions()
        opts.reduceOp = op
        self.pg.allreduce([t], opts).wait()

    def all_reduce_async(self, t: torch.Tensor) -> Any:
        """Start summing ``t`` over the replicas; the handle's wait() finishes it. ``t`` belongs to
        the collective until then (gloo's thread, or NCCL's stream, reads and writes it)."""
        return self.pg.allreduce([t], dist.AllreduceOptions())

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

    def all_reduce_async(self, t: torch.Tensor) -> Any:
        return _Done()

    def broadcast(self, t: torch.Tensor, src: int) -> None:
        return None


class _Done:
    """The handle of a collective over one replica: nothing to wait for."""

    def wait(self) -> bool:
        return True


@dataclass
class InFlight:
    """The one exchange under way with overlapSteps: fragment ``fragment``'s change as of inner
    step ``sent_at``, to be applied after step ``apply_at``. ``wire`` and ``work`` are the buffer
    and handle of the all-reduce until it is settled (waited for and the outer step taken)."""

    fragment: int
    sent_at: int
    apply_at: int
    wire: torch.Tensor | None = None
    work: Any = None
    waited: Callable[[], float] | None = None  # the exposed wait's seconds, read when reported

    @property
    def settled(self) -> bool:
        return self.work is None

    def marker(self) -> dict[str, int]:
        """For a checkpoint's marker: a settled exchange whose mix into the weights is still due."""
        return {"fragment": self.fragment, "sentAt": self.sent_at, "applyAt": self.apply_at}


def fingerprint(signature: Mapping[str, Any]) -> int:
    """A 62-bit digest of a replica's layout signature, equal across replicas that can pair."""
    text = json.dumps(signature, sort_keys=True).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 2


class OuterSync:
    """The outer optimizer of one rank: its anchor and momentum per bucket shard, its fragments.

    With ``overlapSteps`` tau > 0 (Streaming DiLoCo's overlapped exchange, arXiv 2501.18512) a
    fragment p due after inner step t is exchanged while training goes on, and lands tau steps
    later. With w the replica's weights (its fp32 masters), a the anchor, b the momentum:

        after step t:      d_r = a[p] - w_r[p] (as of step t) starts its all-reduce; no wait
        steps t+1..t+tau:  the replica trains on; its weights move on from w_r(t)
        after step t+tau:  wait; d = mean_r(d_r)
                           b[p] = mu * b[p] + d;  a[p] -= lr * (d + mu * b[p])     (the outer step
                           on the delta as of when it was sent, as without overlap)
                           w[p] = alpha * w[p] + (1 - alpha) * a[p]               (alpha = OVERLAP_MIX)

    The mix keeps half of what the replica learnt during the tau steps instead of discarding it
    (alpha 0 would be torchft's default, alpha 1 no outer step at all). Only the mix depends on
    the weights at t+tau; the outer step depends on a, b and d alone, which no other exchange
    touches meanwhile (tau <= innerSteps / fragments: one exchange in flight, whose buffer, one
    fragment of the shard, is all the extra memory). So settle() may take the outer step early,
    before a checkpoint, with the same result: the checkpoint then holds the anchor and momentum
    after the outer step and its marker the mix still due (``outerInFlight``), and a resumed run
    mixes at t+tau as the run that went on did. tau = 0 is the synchronous rule (``sync``): w = a.
    """

    def __init__(self, opt: Any, spec: AcrossIslandsSpec, group: OuterGroup):
        self.opt, self.spec, self.group = opt, spec, group
        every = spec.inner_steps // spec.fragments
        if spec.overlap_steps > every:
            raise ReplicaError(
                f"spec.training.acrossIslands.overlapSteps {spec.overlap_steps} exceeds innerSteps / "
                f"fragments = {every}: one exchange is in flight at a time; make it at most {every}"
            )
        self.in_flight: InFlight | None = None
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
        self.last_bytes = 0
        self.waiter: Callable[[Any], Callable[[], float]] = stream_wait if group.stream_ordered else host_wait

    def after_step(self, iteration: int) -> dict[str, Any] | None:
        """After inner step ``iteration`` (1-based): apply the exchange that lands now, then
        synchronize (or, overlapped, send) the fragment due; the record of what was applied."""
        applied = None
        if self.in_flight is not None and self.in_flight.apply_at == iteration:
            applied = self.apply()
        f = fragment_due(iteration, self.spec.inner_steps, self.spec.fragments)
        if f is None:
            return applied
        if self.spec.overlap_steps == 0:
            return self.sync(f, iteration)
        self.send(f, iteration)
        return applied

    def _delta(self, fragment: int) -> torch.Tensor:
        """The fragment's change since the anchor, flat, on the link's dtype: the exchange's buffer."""
        sl = self.slices[fragment]
        flat = torch.cat([(a[s] - m[s]).flatten() for a, m, s in zip(self.anchors, self.masters, sl)])
        return flat.to(self.exchange_dtype)

    def _outer_step(self, fragment: int, wire: torch.Tensor) -> None:
        """The anchor and momentum of ``fragment`` from the summed deltas ``wire``."""
        delta = wire.to(torch.float32).div_(self.group.size)
        lr, mu = self.spec.outer_learning_rate, self.spec.outer_momentum
        at = 0
        for k, (a, s) in enumerate(zip(self.anchors, self.slices[fragment])):
            n = s.stop - s.start
            d = delta[at : at + n]
            at += n
            if mu > 0:
                buf = self.momenta[k][s]
                buf.mul_(mu).add_(d)
                d = d.add(buf, alpha=mu)  # Nesterov
            a[s].sub_(d, alpha=lr)
        self.outer_steps += 1

    def sync(self, fragment: int, iteration: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.opt.wait_param_gathers()  # the step's all-gathers read the masters we now change
        wire = self._delta(fragment)
        self.group.all_reduce(wire)
        self._outer_step(fragment, wire)
        for a, m, s in zip(self.anchors, self.masters, self.slices[fragment]):
            m[s].copy_(a[s])
        self.opt.republish()  # the replica's parameters from the new masters
        self.last = {
            "outerStep": self.outer_steps,
            "fragment": fragment,
            "iteration": iteration,
            "bytes": wire.numel() * wire.element_size(),
            "seconds": time.perf_counter() - t0,
        }
        return self.last

    def send(self, fragment: int, iteration: int) -> None:
        """Start the overlapped exchange of ``fragment`` as of inner step ``iteration``."""
        if self.in_flight is not None:  # __init__ bounds tau; a second one would double the memory
            raise RuntimeError(
                f"fragment {fragment} due after step {iteration} while fragment {self.in_flight.fragment} "
                f"(sent after step {self.in_flight.sent_at}) has not been applied"
            )
        wire = self._delta(fragment)  # reads the masters only: the step's all-gathers may go on
        work = self.group.all_reduce_async(wire)
        self.in_flight = InFlight(fragment, iteration, iteration + self.spec.overlap_steps, wire, work)

    def settle(self) -> None:
        """Wait for the exchange in flight, if any, and take its outer step (anchor, momentum);
        its mix into the weights stays due at its apply_at. Before a checkpoint and at the end."""
        f = self.in_flight
        if f is None or f.settled:
            return
        f.waited = self.waiter(f.work)
        assert f.wire is not None
        self._outer_step(f.fragment, f.wire)
        self.last_bytes = f.wire.numel() * f.wire.element_size()
        f.wire = f.work = None

    def apply(self) -> dict[str, Any]:
        """The exchange in flight lands: its outer step, then the mix of the fragment's weights."""
        f = self.in_flight
        assert f is not None
        t0 = time.perf_counter()
        self.settle()
        self.opt.wait_param_gathers()  # the step's all-gathers read the masters we now change
        for a, m, s in zip(self.anchors, self.masters, self.slices[f.fragment]):
            m[s].mul_(OVERLAP_MIX).add_(a[s], alpha=1 - OVERLAP_MIX)
        self.opt.republish()
        self.in_flight = None
        self.last = {
            "outerStep": self.outer_steps,
            "fragment": f.fragment,
            "iteration": f.sent_at,
            "appliedAt": f.apply_at,
            "bytes": self.last_bytes,
            # what the link cost beyond the overlapped steps: the training stream's stall on CUDA
            "waitSeconds": f.waited() if f.waited is not None else 0.0,
            "seconds": time.perf_counter() - t0,
        }
        return self.last

    def checkpoint_marker(self) -> dict[str, Any]:
        """Collective over the replicas when an exchange is in flight (settle): what a checkpoint's
        marker needs besides the anchor and momentum, so that a resume is exact."""
        self.settle()
        return {} if self.in_flight is None else {"outerInFlight": self.in_flight.marker()}

    def resume(self, marker: Mapping[str, Any]) -> None:
        """From a checkpoint's marker: the settled exchange whose mix is still due, if any."""
        f = marker.get("outerInFlight")
        self.in_flight = None if f is None else InFlight(f["fragment"], f["sentAt"], f["applyAt"])

    def join(self, iteration: int, signature: Mapping[str, Any]) -> int:
        """Collective over the replicas at start (after any resume): the iteration to go on from.
        When the replicas stand at different iterations, the one furthest on (lowest replica among
        equals) sends its anchor, momentum and iteration; the others take them as their weights.
        Replicas must run the same layout (``signature``): their shards pair rank by rank."""
        R, r = self.group.size, self.group.rank
        fp = fingerprint(signature)
        # on the masters' device: NCCL takes device tensors only (a host tensor fails there)
        device = self.masters[0].device if self.masters else torch.device("cpu")
        key = torch.tensor(
            [iteration * R + (R - 1 - r), -iteration, fp, -fp], dtype=torch.int64, device=device
        )
        self.group.all_reduce(key, dist.ReduceOp.MAX)
        host = key.cpu()  # one read of the device; the questions below are asked on the host
        if not bool(host[2] == -host[3]):
            raise ReplicaError(
                f"replica {r} runs layout {dict(signature)} and another replica a different one: "
                "replicas pair their optimizer shards rank by rank, so every replica needs the same "
                "pipeline, data, tensor, stage split and micro-batches; plan them alike"
            )
        best = int(host[0])
        source, newest = R - 1 - best % R, best // R
        every = self.spec.inner_steps // self.spec.fragments
        self.outer_steps = newest // every
        if bool(host[0] // R == -host[1]):  # the newest iteration is the lowest: all stand alike
            return iteration
        self.opt.wait_param_gathers()
        for t in self.anchors + self.momenta:
            self.group.broadcast(t, source)
        # the source's overlapped exchange whose mix is still due (settled: nothing in flight at start)
        f = self.in_flight
        marker = [-1] * 3 if f is None else [f.fragment, f.sent_at, f.apply_at]
        due = torch.tensor(marker, dtype=torch.int64, device=device)
        self.group.broadcast(due, source)
        fragment, sent_at, apply_at = (int(x) for x in due.cpu())
        self.in_flight = None if fragment < 0 else InFlight(fragment, sent_at, apply_at)
        for a, m in zip(self.anchors, self.masters):
            m.copy_(a)
        self.opt.republish()
        return newest


def _slice(n: int, f: int, fragments: int) -> slice:
    return slice(n * f // fragments, n * (f + 1) // fragments)
