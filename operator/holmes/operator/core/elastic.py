"""Elastic size (``nodes.minCount`` below ``nodes.count``): how many nodes a job runs on now, and
when it grows back. Pure: the planner is passed in, the clock is the caller's.

- Shrinking: a job that cannot plan at ``count`` runs on the largest size down to ``minCount``
  that plans: at once after a restart (the job was running: waiting costs the whole gang), else
  after ``runPolicy.waitForNodesSeconds`` of waiting.
- Growing (``nodes.scaleUp: atCheckpoint``): a job below ``count`` whose nodes are back relaunches
  larger at a checkpoint: at once when the stop itself writes one
  (``training.checkpoint.onPreemption``), else once the trainer reports its next periodic one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime

from holmes.contract import JobSpec, Layout
from holmes.plan import InsufficientNodes, PlanError, PlanTooLarge

PlanFn = Callable[[list, JobSpec], Layout]


@dataclass(frozen=True)
class Sized:
    """The layout to launch, or why to wait (``waiting``, raised by the caller); ``since``: when
    the wait began (to keep in status.waitingSince); ``scaled_down``: the Event message when the
    job runs below count."""

    layout: Layout | None = None
    waiting: InsufficientNodes | None = None
    since: datetime | None = None
    scaled_down: str = ""


def plan_size(
    plan: PlanFn, nodes: list, spec: JobSpec, restarted: bool, since: datetime, now: datetime
) -> Sized:
    """The layout at spec.nodes.count, or a smaller one when the job may run smaller now.
    Raises PlanError when the job cannot be planned at all."""
    try:
        return Sized(layout=plan(nodes, spec))
    except InsufficientNodes as e:
        n = spec.nodes
        if not n.elastic:
            return Sized(waiting=e)
        waited = (now - since).total_seconds()
        wait = spec.run_policy.wait_for_nodes_seconds
        if not restarted and waited < wait:
            why = type(e)(
                f"{e}; nodes.minCount={n.minimum}: runs on fewer after waiting "
                f"{wait - waited:.0f}s more (runPolicy.waitForNodesSeconds={wait})"
            )
            return Sized(waiting=why, since=since)
        # no layout needs more nodes than are listed: start there, not at count - 1
        for count in range(min(n.count - 1, len(nodes)), n.minimum - 1, -1):
            try:
                layout = plan(nodes, spec.replace(nodes=replace(n, count=count)))
            except PlanTooLarge:
                raise  # the sizes tried share one budget: smaller ones cannot search on
            except PlanError:
                continue
            return Sized(
                layout=layout,
                scaled_down=f"running on {count} of {n.count} nodes (nodes.minCount={n.minimum}) with the "
                f"same global batch; {e}",
            )
        return Sized(waiting=type(e)(f"{e}; not even nodes.minCount={n.minimum} nodes can run it"))


def plan_at_least(plan: PlanFn, nodes: list, spec: JobSpec, least: int) -> Layout:
    """The largest layout of at least ``least`` nodes (InsufficientNodes if none plans now)."""
    n = spec.nodes
    for count in range(min(n.count, len(nodes)), least - 1, -1):
        try:
            return plan(nodes, spec.replace(nodes=replace(n, count=count)))
        except PlanTooLarge:
            raise
        except PlanError:
            continue
    raise InsufficientNodes(f"no layout of {least} or more nodes plans now")


@dataclass(frozen=True)
class ScaleUp:
    """What a job running below count does now. ``now``: relaunch larger (``bigger`` nodes can
    run it); ``pending_at``: set status.scaleUpAfter to this checkpoint iteration and relaunch
    after the next one; ``clear``: drop status.scaleUpAfter (the nodes went again)."""

    now: bool = False
    bigger: int = 0
    pending_at: int | None = None
    clear: bool = False


def scale_up(
    spec: JobSpec, current: int, checkpoint: int, after: int | None, bigger: Callable[[int], int]
) -> ScaleUp:
    """``checkpoint``: the trainer's last checkpoint iteration; ``after``: status.scaleUpAfter;
    ``bigger(least)``: the node count of the largest layout of at least ``least`` nodes (raises
    PlanError when none plans)."""
    ckpt_spec = spec.training.checkpoint
    if spec.nodes.scale_up != "atCheckpoint" or not ckpt_spec:
        return ScaleUp()
    if after is not None and checkpoint <= after:
        return ScaleUp()  # nodes are back: waiting for the next checkpoint
    try:  # (again at the checkpoint: the nodes may have gone meanwhile)
        size = bigger(current + 1)
    except PlanError:
        return ScaleUp(clear=True)
    if after is None and not ckpt_spec.on_preemption:
        return ScaleUp(bigger=size, pending_at=checkpoint)
    return ScaleUp(now=True, bigger=size)
