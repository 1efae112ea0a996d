"""The children caches: the Store's rules and the informer's back-off (pure; an Informer against the
real API server: tests/e2e/operator/test_informer.py)."""

from __future__ import annotations

from holmes.operator.core import child_names
from holmes.operator.informer import RETRY_MAX, Store, next_backoff


def obj(name: str, rv: int, job: str = "a", uid: str = "u1", ns: str = "ns") -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid,
            "resourceVersion": str(rv),
            "labels": {child_names.LABEL_JOB: job},
        }
    }


def test_store_keeps_the_newer_version_and_indexes_by_job():
    s = Store(child_names.LABEL_JOB)
    assert s.put(obj("p0", 5)) and s.put(obj("p1", 6)) and s.put(obj("q0", 7, job="b"))
    assert not s.put(obj("p0", 4))  # a late watch event after what a write returned
    assert s.get("ns", "p0")["metadata"]["resourceVersion"] == "5"
    assert [o["metadata"]["name"] for o in s.by_label("ns", "a")] == ["p0", "p1"]
    # the same name with another uid is another object (recreated): it replaces whatever version
    assert s.put(obj("p0", 2, uid="u2"))
    # a label change moves the object between index entries
    assert s.put(obj("p1", 9, job="b"))
    assert [o["metadata"]["name"] for o in s.by_label("ns", "a")] == ["p0"]
    assert [o["metadata"]["name"] for o in s.by_label("ns", "b")] == ["p1", "q0"]
    assert s.by_label("other", "a") == []


def test_store_remove_only_forgets_the_object_of_that_uid():
    s = Store(child_names.LABEL_JOB)
    s.put(obj("p0", 5, uid="new"))
    assert not s.remove(obj("p0", 4, uid="old"))  # the DELETED event of an earlier pod of this name
    assert s.get("ns", "p0") is not None
    assert s.remove(obj("p0", 6, uid="new"))
    assert s.get("ns", "p0") is None and s.by_label("ns", "a") == []


def test_a_write_response_after_the_deletion_does_not_bring_the_object_back():
    s = Store(child_names.LABEL_JOB)
    s.put(obj("p0", 5, uid="u1"))
    assert s.remove(obj("p0", 6, uid="u1"))  # the watch: deleted at once (never scheduled)
    assert not s.put(obj("p0", 6, uid="u1"))  # then the delete call's own response
    assert s.get("ns", "p0") is None and s.by_label("ns", "a") == []
    assert s.put(obj("p0", 7, uid="u2"))  # a new pod of that name is another object


def test_store_replace_reports_the_jobs_whose_objects_changed():
    s = Store(child_names.LABEL_JOB)
    s.put(obj("p0", 1))
    s.put(obj("q0", 1, job="b"))
    s.put(obj("r0", 1, job="c"))
    changed = s.replace([obj("p0", 1), obj("q0", 2, job="b"), obj("s0", 3, job="d")])
    assert changed == {("ns", "b"), ("ns", "c"), ("ns", "d")}  # a: same version, untouched
    assert len(s) == 3


def test_store_replace_of_one_namespace_keeps_the_other_namespaces_objects():
    """Per-namespace informers (watch.namespaces: [a, b]) share one store: a's LIST must not
    drop b's pods, or the operator would believe b's jobs lost their pods."""
    s = Store(child_names.LABEL_JOB)
    s.put(obj("p0", 1, ns="a"))
    s.put(obj("q0", 1, job="b", ns="b"))
    changed = s.replace([obj("p1", 2, ns="a")], namespace="a")
    assert changed == {("a", "a")}
    assert s.get("b", "q0") is not None and [o["metadata"]["name"] for o in s.by_label("b", "b")] == ["q0"]
    assert s.get("a", "p0") is None and s.get("a", "p1") is not None
    # unscoped: the whole store is the LIST
    s.replace([obj("p1", 2, ns="a")])
    assert s.get("b", "q0") is None


def test_after_a_long_outage_an_informer_tries_again_within_a_few_seconds():
    waits, b = [], 1.0
    for _ in range(8):  # eight failed tries: the API server restarting for ~30 s
        waits.append(b)
        b = next_backoff(b)
    assert waits == [1, 2, 4, 5, 5, 5, 5, 5] and RETRY_MAX <= 5
    # (it was 1, 2, 4, 8, 16, 30: a restarted operator's caches filled 30 s after the API server
    # was back, and no job acted meanwhile)
