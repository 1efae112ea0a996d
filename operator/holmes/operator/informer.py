"""In-memory caches of the operator's children (pods, ConfigMaps, Services), kept by LIST then
WATCH with a server-side label selector, so a reconcile reads memory instead of the API server.

kopf watches every object of a kind and filters labels client-side; on a shared cluster that is
every pod of every team. These watches ask the API server for Holmes' children only
(``app.kubernetes.io/managed-by=holmes``), one LIST at start and after an expired watch (410
Gone), then one long WATCH request every few minutes.

Read-your-writes: the operator puts the objects its own writes return into the store (``put``),
so the reconcile right after a create sees it even before the watch delivers it. A store keeps
the newer of two versions of an object by resourceVersion, so a late watch event never rolls
back what a write returned.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

log = logging.getLogger("holmes.operator.informer")
WATCH_SECONDS = 270  # the API server ends each watch after this; it is resumed from the last version


GONE_KEPT = 10_000  # deleted uids remembered per store (a uid is never reused)


def _rv(obj: Mapping) -> int | None:
    v = (obj.get("metadata") or {}).get("resourceVersion")
    return int(v) if isinstance(v, str) and v.isdigit() else None


def _key(obj: Mapping) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


class Store:
    """Objects of one kind by (namespace, name), indexed by the value of one label."""

    def __init__(self, index_label: str | None) -> None:
        self.index_label = index_label
        self._lock = threading.Lock()
        self._objs: dict[tuple[str, str], dict] = {}
        self._index: dict[tuple[str, str], set[str]] = {}
        # uids whose deletion the watch reported: a write's response that arrives after it (an
        # object deleted at once) must not bring the object back
        self._gone: OrderedDict[str, None] = OrderedDict()
        self.version = 0  # moves on every change: views derived from the store can be kept
        self._snapshot: tuple[int, list[dict]] = (-1, [])

    def label(self, obj: Mapping) -> str | None:
        if self.index_label is None:
            return None
        return ((obj.get("metadata") or {}).get("labels") or {}).get(self.index_label)

    def _set(self, obj: dict) -> None:  # under the lock
        self.version += 1
        key = _key(obj)
        self._unset(key)
        self._objs[key] = obj
        label = self.label(obj)
        if label is not None:
            self._index.setdefault((key[0], label), set()).add(key[1])

    def _unset(self, key: tuple[str, str]) -> None:  # under the lock
        self.version += 1
        old = self._objs.pop(key, None)
        label = self.label(old) if old is not None else None
        if label is not None:
            names = self._index.get((key[0], label))
            if names is not None:
                names.discard(key[1])
                if not names:
                    del self._index[(key[0], label)]

    def put(self, obj: dict) -> bool:
        """Store ``obj`` unless the store holds a newer version of it or saw it deleted; True
        if stored."""
        with self._lock:
            if (obj.get("metadata") or {}).get("uid") in self._gone:
                return False
            old = self._objs.get(_key(obj))
            if old is not None and old["metadata"].get("uid") == obj["metadata"].get("uid"):
                a, b = _rv(old), _rv(obj)
                if a is not None and b is not None and b < a:
                    return False
            self._set(obj)
            return True

    def remove(self, obj: Mapping) -> bool:
        """Forget ``obj`` (a DELETED event); a newer object of the same name (another uid) stays."""
        key = _key(obj)
        uid = (obj.get("metadata") or {}).get("uid")
        with self._lock:
            if uid:
                self._gone[uid] = None
                while len(self._gone) > GONE_KEPT:
                    self._gone.popitem(last=False)
            old = self._objs.get(key)
            if old is None or old["metadata"].get("uid") != uid:
                return False
            self._unset(key)
            return True

    def replace(self, objs: list[dict], namespace: str | None = None) -> set[tuple[str, str]]:
        """Take a fresh LIST (of ``namespace`` only, when given: several per-namespace informers
        share a store, and one's LIST must not drop the others' objects); the index values
        (namespace, label) whose objects changed."""
        with self._lock:
            before = {k: o for k, o in self._objs.items() if namespace is None or k[0] == namespace}
            for key in before:
                self._unset(key)
            for o in objs:
                self._set(o)
            changed = set()
            for key in set(before) | {_key(o) for o in objs}:
                a, b = before.get(key), self._objs.get(key)
                either = a or b  # never None: each key comes from one of them
                if either is not None and (a is None or b is None or _rv(a) != _rv(b)):
                    label = self.label(either)
                    if label is not None:
                        changed.add((key[0], label))
            return changed

    def get(self, ns: str, name: str) -> dict | None:
        with self._lock:
            return self._objs.get((ns, name))

    def remove_name(self, ns: str, name: str) -> None:
        with self._lock:
            self._unset((ns, name))

    def values(self) -> list[dict]:
        with self._lock:
            return list(self._objs.values())

    def snapshot(self) -> list[dict]:
        """values(), one list per version (read it, never change it): every job's reconcile
        reads all nodes, and an unchanged list lets what is derived from it be kept
        (state.node_index)."""
        with self._lock:
            if self._snapshot[0] != self.version:
                self._snapshot = (self.version, list(self._objs.values()))
            return self._snapshot[1]

    def by_label(self, ns: str, value: str) -> list[dict]:
        with self._lock:
            return [self._objs[(ns, n)] for n in sorted(self._index.get((ns, value), ()))]

    def __len__(self) -> int:
        with self._lock:
            return len(self._objs)


# A failed LIST or WATCH is tried again after 1, 2, 4, then every RETRY_MAX seconds: an API
# server back from a restart is seen within RETRY_MAX (with 30 s, as client-go's reflector caps
# it, an operator whose caches were not filled yet waited up to 30 s more before acting: 38 s
# to recover from a 25 s API server restart in bench/control_plane_faults.py). While the API
# server is down that is one refused connection per informer every few seconds.
RETRY_MAX = 5.0


def next_backoff(backoff: float) -> float:
    return min(backoff * 2, RETRY_MAX)


class Informer:
    """Keeps ``store`` equal to what ``list_fn`` (a kubernetes client LIST function, namespaced
        by partial application or cluster-wide) returns for ``selector``, in a daemon thread. Calls
        ``on_change(namespace, label_value)`` for every object that changed (from that thread), or
        ``on_change(namespace, "")`` when the store has no index label. ``field_selector`` narrows the
        watch further (e.g. pods that have not ended); ``transform`` slims each object before it is
        stored (the cluster-wide pod cache keeps only what capacity planning reads); ``on_object``
    sees each (event type, object) too."""

    def __init__(
        self,
        kind: str,
        list_fn: Callable[..., Any],
        selector: str,
        store: Store,
        on_change: Callable[[str, str], None],
        namespace_ok: Callable[[str], bool] = lambda ns: True,
        field_selector: str | None = None,
        transform: Callable[[dict], dict] | None = None,
        namespace: str | None = None,  # the one namespace list_fn lists, if it lists one
        on_object: Callable[[str, dict], None] | None = None,
    ) -> None:
        self.kind, self.list_fn, self.selector, self.store = kind, list_fn, selector, store
        self.namespace = namespace
        self.on_change, self.namespace_ok = on_change, namespace_ok
        self.fields = {"field_selector": field_selector} if field_selector else {}
        self.transform = transform or (lambda o: o)
        # (event type, object) of every event, "LISTED" for a LIST's (from the thread)
        self.on_object = on_object or (lambda kind, obj: None)
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name=f"informer-{kind}", daemon=True)

    def start(self) -> Informer:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop at once: the thread's blocked read of the watch is woken by shutting its socket
        down. Closing the response here instead would wait for that read to return (the reader
        holds the stream's lock): up to the next event or WATCH_SECONDS, on the event loop."""
        self._stop.set()
        conn = getattr(self._resp, "connection", None)  # urllib3's, while the stream is open
        sock = getattr(conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # closed already
                pass

    # ---- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                rv = self._list()
                self.synced.set()
                backoff = 1.0
                while not self._stop.is_set():
                    rv = self._watch(rv)
            except _Expired:
                log.debug("%s watch expired; listing again", self.kind)
            except Exception as e:  # the API server restarting, a network blip: list again
                if self._stop.is_set():
                    return
                log.warning(
                    "%s watch failed; listing again in %.0fs: %s",
                    self.kind,
                    backoff,
                    e,
                    extra={"error": str(e)},
                )
                self._stop.wait(backoff)
                backoff = next_backoff(backoff)

    def _list(self) -> str:
        resp = self.list_fn(
            label_selector=self.selector, **self.fields, _preload_content=False, _request_timeout=60
        )
        body = json.loads(resp.data)
        items = [self.transform(o) for o in body.get("items") or [] if self.namespace_ok(_key(o)[0])]
        for o in items:
            self.on_object("LISTED", o)
        for changed in self.store.replace(items, self.namespace):
            self.on_change(*changed)
        if self.store.index_label is None:
            self.on_change("", "")
        return body["metadata"]["resourceVersion"]

    def _watch(self, rv: str) -> str:
        started = time.monotonic()
        try:
            resp = self.list_fn(
                label_selector=self.selector,
                **self.fields,
                watch=True,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_SECONDS,
                _preload_content=False,
                _request_timeout=(10, WATCH_SECONDS + 30),
            )
        except ApiException as e:
            if e.status == 410:
                raise _Expired() from e
            raise
        self._resp = resp
        try:
            for line in iter_resp_lines(resp):
                if self._stop.is_set():
                    break
                if not line or line.isspace():
                    continue
                ev = json.loads(line)
                obj = ev.get("object") or {}
                if ev.get("type") == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired()
                    raise ApiException(
                        status=obj.get("code"), reason=f"{obj.get('reason')}: {obj.get('message')}"
                    )
                rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                if ev.get("type") == "BOOKMARK" or not self.namespace_ok(_key(obj)[0]):
                    continue
                obj = self.transform(obj)
                changed = self.store.remove(obj) if ev["type"] == "DELETED" else self.store.put(obj)
                self.on_object(ev["type"], obj)
                label = self.store.label(obj)
                if changed and label is not None:
                    self.on_change(_key(obj)[0], label)
                elif changed and self.store.index_label is None:
                    self.on_change(_key(obj)[0], "")
        finally:
            self._resp = None
            resp.close()
            resp.release_conn()
        if time.monotonic() - started < 1.0 and not self._stop.is_set():
            self._stop.wait(1.0)  # a watch that ends at once must not spin
        return rv


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""
