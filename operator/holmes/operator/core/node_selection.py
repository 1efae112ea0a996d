"""The parts of a placement that scale with the cluster, kept while the nodes stay the same:
which nodes a job may take (its ``nodes.selector``), which jobs ahead in the queue can touch
them, and why a pod of a given shape can never go to a node (capacity.placement_problem)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from holmes.contract import JobSpec
from holmes.plan.discovery import kept_key


class _Queued(Protocol):  # capacity.Waiting (imported by capacity: no circle back)
    @property
    def spec(self) -> JobSpec: ...


W = TypeVar("W", bound=_Queued)


def selected(nodes: Sequence[Mapping], spec: JobSpec) -> list:
    """The nodes ``spec.nodes.selector`` matches (all of them without one), as the planner picks."""
    return list(_SELECTIONS.of(nodes, spec.nodes.selector)[0])


def selected_names(nodes: Sequence[Mapping], spec: JobSpec) -> frozenset[str]:
    """The names of ``selected(nodes, spec)``."""
    return _SELECTIONS.of(nodes, spec.nodes.selector)[1]


class _Selections:
    """The nodes each selector matches, for the last node list asked about. A placement selects
    for its job and for every job ahead of it, on the same nodes (the same list, or an equal one:
    compared element by element, identical elements first), with a few selectors (an island or
    two each, in practice): at 2,000 nodes matching anew was a tenth of a placement."""

    KEPT = 256  # selectors kept for one node list

    def __init__(self) -> None:
        self._kept: tuple[list, dict] = ([], {})

    def of(self, nodes: Sequence[Mapping], sel: object) -> tuple[tuple[Mapping, ...], frozenset[str]]:
        listed, answers = self._kept
        if listed is not nodes and (len(listed) != len(nodes) or listed != list(nodes)):
            listed, answers = list(nodes), {}
            self._kept = (listed, answers)  # one assignment: threads see the old pair or the new
        try:
            hit = answers.get(sel)
        except TypeError:  # an unhashable selector (none is): matched each time
            return _select(nodes, sel)
        if hit is None:
            hit = _select(nodes, sel)
            if len(answers) >= self.KEPT:
                answers.clear()
            answers[sel] = hit
        return hit


def _select(nodes: Sequence[Mapping], sel: object) -> tuple[tuple[Mapping, ...], frozenset[str]]:
    matches = getattr(sel, "matches", None)
    chosen = tuple(n for n in nodes if matches is None or matches((n.get("metadata") or {}).get("labels")))
    return chosen, frozenset((n.get("metadata") or {}).get("name") or "" for n in chosen)


_SELECTIONS = _Selections()


def bearing_on(ahead: Sequence[W], own: frozenset[str], nodes: Sequence[Mapping]) -> list[W]:
    """The jobs ``ahead`` (in queue order) whose placement can change what is free on the nodes
    ``own``: a job ahead takes and keeps only nodes its selector matches, so it bears on them
    when its nodes meet them or meet those of a later job ahead that bears on them. The others
    need not be weighed (at 2,000 nodes in 8 islands, most of the queue ahead)."""
    reach = set(own)
    bearing = []
    for w in reversed(ahead):
        theirs = selected_names(nodes, w.spec)
        if not reach.isdisjoint(theirs):
            bearing.append(w)
            reach |= theirs
    bearing.reverse()
    return bearing


def without(nodes: Sequence[Mapping], names_: Mapping[str, str]) -> list:
    return [n for n in nodes if (n.get("metadata") or {}).get("name") not in names_]


def with_exclusions(msg: str, excluded: Mapping[str, str]) -> str:
    """``msg``, naming the nodes the template rules out (free_view's ``excluded``)."""
    if not excluded:
        return msg
    items = sorted(excluded.items())
    listed = "; ".join(f"node {k}: {v}" for k, v in items[:5])
    more = f" (and {len(items) - 5} more)" if len(items) > 5 else ""
    return f"{msg}; the template rules out {len(items)} node(s): {listed}{more}"


class _Problems:
    """A node's placement problem for a pod shape, answered once per node version (the key the
    node cache kept: discovery.kept_key) and shape. Every placement asks it of every node for
    the job and each job ahead of it: at 2,000 nodes, parsing the same allocatable and taints
    anew was a fifth of a placement. Bounded: emptied when it holds ``KEPT`` answers."""

    KEPT = 100_000

    def __init__(self) -> None:
        self._answers: dict[tuple, dict[tuple, str]] = {}  # (judge, shape) -> node version -> why
        self._size = 0

    def of(self, shape: Any, judge: Callable[[Mapping, Any], str]) -> Callable[[Mapping], str]:
        """``judge(node, shape)`` (capacity.placement_problem: it reads only what the node
        version covers), answered once per node version."""
        try:
            answers = self._answers.setdefault((judge, _shape_key(shape)), {})
        except TypeError:  # a value that is no string (an odd template): judged each time
            return lambda node: judge(node, shape)

        def problem(node: Mapping) -> str:
            key = kept_key(node)
            if key is None:  # a node not from the cache (a copy with other labels, a test's)
                return judge(node, shape)
            why = answers.get(key)
            if why is None:
                why = answers[key] = judge(node, shape)
                self._size += 1  # a lost count between threads only moves when it empties
                if self._size > self.KEPT:
                    self._answers, self._size = {}, 0
            return why

        return problem


def _shape_key(shape: Any) -> tuple:  # a capacity.PodShape
    def frozen(v: object) -> object:
        if isinstance(v, Mapping):
            return tuple(sorted((k, frozen(x)) for k, x in v.items()))
        if isinstance(v, (list, tuple)):
            return tuple(frozen(x) for x in v)
        return v

    key = tuple(frozen(getattr(shape, f.name)) for f in dataclasses.fields(shape))
    hash(key)
    return key


PROBLEMS = _Problems()
