"""A bounded meeting point after the start weights are loaded, before the first pipeline send.

Without it a stage whose weights sit on slow storage starts late, and its neighbours wait for
its first activation inside NCCL until the process-group timeout (600 s) kills the job with a
message about a collective, not about storage. Here every rank reports how long its load took
to rank 0 over the host group (gloo); rank 0 waits at most :data:`WAIT_FRACTION` of the
process-group timeout for the last one, then answers every rank that arrived with the same
verdict: go on, or stop naming the ranks that did not arrive. Rank 0 itself late: the others
stop when its verdict has not come within :data:`VERDICT_FRACTION` of the timeout, naming it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import torch
import torch.distributed as dist

WAIT_FRACTION = 0.5  # of the process-group timeout: the verdict comes well before NCCL's
VERDICT_FRACTION = 0.9  # of it: how long the others wait for rank 0's verdict


class WeightLoadError(RuntimeError):
    pass


def late_message(late: list[int], bound: float, seconds: dict[int, float], what: str) -> str:
    """Why this run stops, for every rank alike (pure)."""
    took = ", ".join(f"rank {r}: {s:.1f} s" for r, s in sorted(seconds.items()))
    names = ", ".join(str(r) for r in late)
    return (
        f"rank(s) {names} did not finish loading {what} within {bound:.0f} s of the others "
        f"(loaded: {took}). Their nodes' storage is slower: put the weights on a faster volume "
        "for those pods (node-local disk, a faster PVC), or raise HOLMES_TIMEOUT_SECONDS (this "
        f"wait is {WAIT_FRACTION:g} of it), rather than let the first pipeline send time out"
    )


def meet_after_load(seconds: float, group: Any, timeout_seconds: float, what: str) -> dict[int, float]:
    """Collective over host ``group`` (every rank, right after its load of ``what`` that took
    ``seconds``): every rank's load seconds once all arrived within the bound; else
    WeightLoadError naming the late ranks, on every rank that arrived."""
    bound = WAIT_FRACTION * timeout_seconds
    me, size = dist.get_rank(group), dist.get_world_size(group)
    to_global = dist.get_global_rank
    mine = torch.tensor([seconds], dtype=torch.float64)
    if me != 0:
        try:
            dist.send(mine, to_global(group, 0), group=group)
        except RuntimeError as e:  # rank 0 stopped the run already: this rank came too late
            raise WeightLoadError(
                f"rank 0 stopped waiting before this rank ({me}) finished loading {what} in "
                f"{seconds:.1f} s: {late_message([me], bound, {}, what)} ({e})"
            ) from None
        verdict = torch.zeros(size + 1, dtype=torch.float64)  # [late count, each rank's seconds]
        work = dist.irecv(verdict, to_global(group, 0), group=group)
        patience = VERDICT_FRACTION * timeout_seconds
        if not _arrived([work], time.monotonic() + patience)[0]:
            raise WeightLoadError(
                f"no word from rank 0 within {patience:.0f} s of loading {what} "
                f"(this rank, {me}, took {seconds:.1f} s): rank 0 has not finished loading, or it "
                "stopped the run because this rank was late (its error names the late ranks). Put "
                "the weights on faster storage for the slow pods, or raise HOLMES_TIMEOUT_SECONDS"
            )
        return _outcome(verdict, bound, what)
    arrivals = {}
    for r in range(1, size):
        buf = torch.zeros(1, dtype=torch.float64)
        arrivals[r] = (buf, dist.irecv(buf, to_global(group, r), group=group))
    # every rank gets the same bound, counted from rank 0's arrival
    done = _arrived([w for _, w in arrivals.values()], time.monotonic() + bound)
    took = {0: seconds}
    took.update({r: float(buf[0]) for (r, (buf, _)), ok in zip(arrivals.items(), done) if ok})
    late = [r for r in range(size) if r not in took]
    verdict = torch.tensor([len(late)] + [took.get(r, -1.0) for r in range(size)], dtype=torch.float64)
    for r in took:
        if r != 0:
            dist.send(verdict, to_global(group, r), group=group)
    return _outcome(verdict, bound, what)


def _arrived(works: list[Any], deadline: float) -> list[bool]:
    """Which of ``works`` completed by ``deadline`` (time.monotonic). Each is waited for on a
    thread of its own (gloo's receive reports completion only through wait): a wait with a
    timeout would close the group's connections, and the verdict still has to travel on them.
    A late rank's thread is left waiting: this process is about to stop."""
    done = [threading.Event() for _ in works]
    failed: list[BaseException] = []

    def wait(work: Any, event: threading.Event) -> None:
        try:
            work.wait()
            event.set()
        except BaseException as e:  # the peer went away: not arrived
            failed.append(e)

    for w, e in zip(works, done):
        threading.Thread(target=wait, args=(w, e), daemon=True, name="holmes-load-barrier").start()
    for e in done:
        e.wait(max(0.0, deadline - time.monotonic()))
    return [e.is_set() for e in done]


def _outcome(verdict: torch.Tensor, bound: float, what: str) -> dict[int, float]:
    values = verdict.tolist()
    took = {r: s for r, s in enumerate(values[1:]) if s >= 0}
    if int(values[0]):
        late = [r for r, s in enumerate(values[1:]) if s < 0]
        raise WeightLoadError(late_message(late, bound, took, what))
    return took
