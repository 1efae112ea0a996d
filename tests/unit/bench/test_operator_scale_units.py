"""bench/operator_scale.py's reading of the operator's request counter: every answer's code of a
(verb, resource) together, from the operator's own exposition."""

from __future__ import annotations

import operator_scale  # bench/ is on pytest's pythonpath; it puts hack/ on sys.path itself
from prometheus_client import CollectorRegistry, Counter, generate_latest


def test_requests_summed_over_answers():
    registry = CollectorRegistry()
    c = Counter("holmes_api_requests_total", "", ["verb", "resource", "code"], registry=registry)
    c.labels("LIST", "pods", "200").inc(3)
    c.labels("LIST", "pods", "429").inc(2)
    c.labels("POST", "events", "unknown").inc()
    got = operator_scale.operator_requests(generate_latest(registry).decode())
    assert got == {("LIST", "pods"): 5.0, ("POST", "events"): 1.0}
