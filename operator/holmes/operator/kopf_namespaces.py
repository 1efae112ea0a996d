"""A fix for kopf 1.45.2's namespace observer, applied before ``kopf.operator`` starts.

With namespace patterns (``--namespace=team-*``) kopf lists the Namespaces once, then starts a
watcher that lists them again and reports that second listing as events of type None, which
``process_discovered_namespace_event`` drops. A namespace created between the two lists is
therefore never served: no watcher for its HolmesJobs, no log line, until the operator restarts.
Seen in bench/operator_scale.py at 500 nodes, where the bench creates its namespaces right after
the operator answers its health check: in 3 of 8 runs the first namespace's jobs never launched.

The fix counts the watcher's listed Namespaces as present (what kopf does with its own first
list). It replaces one function of kopf's, so it is tied to the pinned release: another kopf
version refuses to start until this is checked against it.
"""

from __future__ import annotations

from typing import Any

import kopf
from kopf._core.reactor import observation

CHECKED_KOPF = "1.45.2"  # the release whose observation.py this fix was read against
_original = observation.process_discovered_namespace_event


async def _namespace_event(*, raw_event: Any, namespaces: Any, insights: Any, **_: Any) -> None:
    if raw_event["type"] is None and raw_event.get("object") is not None:  # the watcher's listing
        raw_event = {**raw_event, "type": "ADDED"}
    await _original(raw_event=raw_event, namespaces=namespaces, insights=insights)


def apply() -> None:
    """Install the fix (idempotent); refuse a kopf release it was not checked against."""
    version = getattr(kopf, "__version__", None) or _installed_version()
    if version != CHECKED_KOPF:
        raise RuntimeError(
            f"kopf {version} is installed; holmes.operator.kopf_namespaces was checked against "
            f"kopf {CHECKED_KOPF}: install kopf=={CHECKED_KOPF} (operator/pyproject.toml pins it) "
            "or check the fix against the new release's kopf/_core/reactor/observation.py"
        )
    observation.process_discovered_namespace_event = _namespace_event


def _installed_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kopf")
    except PackageNotFoundError:
        return None
