"""Layouts for contract tests: looped and V-shaped ones with virtual stages (chunks)."""

from __future__ import annotations

from holmes.contract import pipeline_schedules as sched
from holmes.contract.layout import VIRTUAL_VERSION, GroupFamily, Layout, Stage


def virtual_layout(schedule: str, chunks: list[list[tuple[int, int]]], *, version=VIRTUAL_VERSION, wrap=None):
    P = len(chunks)
    wrap = sched.needs_wrap_link(schedule, P, len(chunks[0])) if wrap is None else wrap
    stages = tuple(
        Stage(
            i,
            (min(a for a, _ in c), max(b for _, b in c)),
            f"isl{i}/infiniband",
            "infiniband",
            "IB",
            chunks=tuple(c) if len(c) > 1 else (),
        )
        for i, c in enumerate(chunks)
    )
    groups = (GroupFamily("pp", "Socket"),) + tuple(
        GroupFamily("p2p", "Socket", b) for b in range(P if wrap else P - 1)
    )
    return Layout(
        1, P, 1, 1, tuple(f"n{i}" for i in range(P)), stages, groups, 1, 8, schedule=schedule, version=version
    )
