"""An Informer against the real API server: it lists, then watches only the selected objects (the
Store's rules, pure: tests/unit/operator/test_informer.py)."""

from __future__ import annotations

import functools
import threading
import time

from kubernetes import client

from holmes.operator.core import child_names
from holmes.operator.informer import Informer, Store


def wait_until(what, fn, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


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
