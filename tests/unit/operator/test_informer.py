"""The children caches: the Store's rules (pure) and an Informer against the real API server."""

from __future__ import annotations

import functools
import threading
import time

from kubernetes import client

from holmes.operator.core import child_names
from holmes.operator.informer import RETRY_MAX, Informer, Store, next_backoff


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


def wait_until(what, fn, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_after_a_long_outage_an_informer_tries_again_within_a_few_seconds():
    waits, b = [], 1.0
    for _ in range(8):  # eight failed tries: the API server restarting for ~30 s
        waits.append(b)
        b = next_backoff(b)
    assert waits == [1, 2, 4, 5, 5, 5, 5, 5] and RETRY_MAX <= 5
    # (it was 1, 2, 4, 8, 16, 30: a restarted operator's caches filled 30 s after the API server
    # was back, and no job acted meanwhile)


def test_informer_lists_then_watches_only_the_selected_objects(cluster, namespace):
    core = client.CoreV1Api(cluster.api_client())
    labels = {child_names.LABEL_MANAGED_BY: child_names.MANAGED_BY, child_names.LABEL_JOB: "j"}

    def cm(name: str, data: str, labelled: bool = True) -> dict:
        meta = {"name": name, **({"labels": labels} if labelled else {})}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": data}}

    core.create_namespaced_config_map(namespace, cm("before", "0"))
    store = Store(child_names.LABEL_JOB)
    seen: list[tuple[str, str]] = []
    lock = threading.Lock()

    def changed(ns, job):
        with lock:
            seen.append((ns, job))

    inf = Informer(
        "configmaps",
        functools.partial(core.list_namespaced_config_map, namespace),
        f"{child_names.LABEL_MANAGED_BY}={child_names.MANAGED_BY},{child_names.LABEL_JOB}",
        store,
        changed,
    ).start()
    try:
        assert inf.synced.wait(20)
        assert store.get(namespace, "before")["data"] == {"k": "0"}  # from the LIST
        core.create_namespaced_config_map(namespace, cm("after", "1"))
        core.create_namespaced_config_map(namespace, cm("other", "x", labelled=False))
        wait_until("the created ConfigMap", lambda: store.get(namespace, "after") is not None)
        core.patch_namespaced_config_map("after", namespace, {"data": {"k": "2"}})
        wait_until("the update", lambda: store.get(namespace, "after")["data"] == {"k": "2"})
        core.delete_namespaced_config_map("before", namespace)
        wait_until("the deletion", lambda: store.get(namespace, "before") is None)
        assert store.get(namespace, "other") is None  # not selected: never sent by the server
        with lock:
            assert seen and set(seen) == {(namespace, "j")}
        # an idle watch stops at once (the operator's shutdown waits for it on its event loop)
        stopping = threading.Thread(target=inf.stop)
        stopping.start()
        stopping.join(2)
        assert not stopping.is_alive(), "stop() waited for the idle watch"
        inf._thread.join(2)
        assert not inf._thread.is_alive(), "the informer's thread still reads its watch"
    finally:
        inf.stop()
