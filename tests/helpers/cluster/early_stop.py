"""Session-scoped clusters stopped after the last test that uses them, not at the session's end.

The e2e tier runs first (tests/conftest.py's order), yet its session clusters (the ``cluster``,
``member_clusters``, ``hollow_bench_cluster``) stayed up, idle, until pytest exited: through
the rest of the e2e tier and the whole integration and unit tiers, on the 2 cores they share.
An idle control plane costs about 4 % of a core (measured: 2.3 s of CPU a minute). A fixture
registers its stop here; tests/e2e/conftest.py's ``pytest_runtest_teardown`` calls it once the
last test asking for the fixture has been torn down, and the fixture's own finalizer, still
called at the end, then finds it done.
"""

from __future__ import annotations

from collections.abc import Callable


class Once:
    """A stop that runs at most once, whoever calls it first."""

    def __init__(self, stop: Callable[[], None]):
        self._stop, self.done = stop, False

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            self._stop()


_STOPS: dict[str, Once] = {}
_LAST_USER: dict[str, int] = {}
_INDEX: dict[int, int] = {}


def stop_after_last_user(fixture: str, stop: Callable[[], None]) -> Once:
    """Register ``stop`` for the session fixture named ``fixture``; the fixture's finalizer
    calls what this returns too (a no-op once the early stop ran)."""
    _STOPS[fixture] = once = Once(stop)
    return once


def stop_unneeded(item, items: list) -> None:
    """After ``item``'s teardown: stop every registered fixture no later test asks for."""
    if not _STOPS:
        return
    if not _INDEX:
        _INDEX.update({id(it): n for n, it in enumerate(items)})
    here = _INDEX.get(id(item))
    if here is None:
        return
    for name, once in _STOPS.items():
        if once.done:
            continue
        if name not in _LAST_USER:
            _LAST_USER[name] = max((n for n, it in enumerate(items) if name in it.fixturenames), default=-1)
        if here >= _LAST_USER[name]:
            once()
