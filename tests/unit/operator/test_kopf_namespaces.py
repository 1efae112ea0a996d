"""kopf 1.45.2 drops Namespaces its namespace watcher lists (type None events): one created between
the observer's first list and the watcher's own is never served. holmes.operator.kopf_namespaces
counts them; these run kopf's own observation code."""

from __future__ import annotations

import asyncio

import pytest
from kopf._cogs.structs import references
from kopf._core.reactor import observation

from holmes.operator import kopf_namespaces


def _served(fn, events, patterns=("team-*",)) -> set:
    async def go():
        insights = references.Insights()
        for e in events:
            await fn(raw_event=e, namespaces=list(patterns), insights=insights)
        return insights.namespaces

    return asyncio.run(go())


def _ns(name: str, type_: str | None) -> dict:
    return {"type": type_, "object": {"metadata": {"name": name}}}


def test_kopf_alone_drops_a_namespace_its_watcher_lists():
    # if this fails, kopf fixed it: delete holmes.operator.kopf_namespaces
    assert _served(kopf_namespaces._original, [_ns("team-a", None)]) == set()


def test_the_fix_serves_listed_namespaces_and_keeps_patterns_and_deletions(monkeypatch):
    monkeypatch.setattr(observation, "process_discovered_namespace_event", kopf_namespaces._original)
    kopf_namespaces.apply()
    fixed = observation.process_discovered_namespace_event
    assert fixed is kopf_namespaces._namespace_event
    assert _served(fixed, [_ns("team-a", None), _ns("other", None), _ns("team-b", "ADDED")]) == {
        "team-a",
        "team-b",
    }
    assert _served(fixed, [_ns("team-a", None), _ns("team-a", "DELETED")]) == set()
    # kopf's observer looks the function up by name when it starts its watcher: the fix is used
    assert "process_discovered_namespace_event" in observation.namespace_observer.__code__.co_names


def test_another_kopf_release_is_refused_until_checked(monkeypatch):
    monkeypatch.setattr(observation, "process_discovered_namespace_event", kopf_namespaces._original)
    monkeypatch.setattr(kopf_namespaces.kopf, "__version__", "1.46.0", raising=False)
    with pytest.raises(RuntimeError, match=r"kopf 1\.46\.0 is installed.*install kopf==1\.45\.2"):
        kopf_namespaces.apply()
    assert observation.process_discovered_namespace_event is kopf_namespaces._original
