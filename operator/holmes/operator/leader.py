"""Leader election through a ``coordination.k8s.io/v1`` Lease, the way Kubernetes' own
controllers do it, so that two operator replicas never reconcile the same jobs.

Every replica runs kopf and fills its caches (a warm standby); only the leader's job loops act.
The leader renews the Lease every ``retry`` seconds. A follower takes over once the Lease's
record (holder, renewTime) has not changed for ``duration`` seconds *of its own clock* (no
comparison of clocks across machines), or at once when the holder released it on a clean exit.
A leader that cannot renew for ``renew_deadline`` (< duration) seconds exits the process before
a follower may take over, so two leaders never write at the same time; Kubernetes restarts it
as a follower. Updates carry the resourceVersion read, so two followers cannot both win.

Worst case from a leader's death to a new leader: duration + retry (8 + 2 s by default).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException

from . import metrics

log = logging.getLogger("holmes.operator.leader")


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    duration: float = 15.0  # a follower waits this long on an unchanged record
    renew_deadline: float = 10.0  # a leader that cannot renew for this long exits
    retry: float = 2.0  # seconds between tries (leader: renewals; followers: looks)

    def __post_init__(self) -> None:
        if not 0 < self.retry < self.renew_deadline < self.duration:
            raise ValueError(
                f"need 0 < retry ({self.retry:g}) < renew deadline ({self.renew_deadline:g}) "
                f"< lease duration ({self.duration:g})"
            )


def micro_time(t: float) -> str:
    """A Lease's MicroTime: RFC 3339 with microseconds."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def may_acquire(spec: Mapping, me: str, unchanged_for: float, default_duration: float) -> bool:
    """Whether ``me`` may write itself into a Lease whose spec is ``spec``, whose record this
    replica has seen unchanged for ``unchanged_for`` seconds."""
    holder = spec.get("holderIdentity") or ""
    if not holder or holder == me:
        return True
    duration = spec.get("leaseDurationSeconds") or default_duration
    return unchanged_for >= float(duration)


def next_spec(spec: Mapping, me: str, duration: float, now: float) -> dict:
    """The Lease spec with ``me`` holding it, renewed at ``now``."""
    taking = (spec.get("holderIdentity") or "") != me
    out = dict(spec)
    out.update(
        holderIdentity=me,
        leaseDurationSeconds=max(1, int(round(duration))),
        renewTime=micro_time(now),
    )
    if taking:
        out["acquireTime"] = micro_time(now)
        # Every change of holder after the first (a Lease just created has none before it).
        out["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if spec else 0)
    return out


class LeaderElector:
    """Acquires and renews the Lease; ``leading`` is set while this replica leads. ``on_lost``
    runs when a leader could not renew in time (the default exits the process at once).
    ``stuck`` says why this replica's reconciles make no progress ('' while they do,
    liveness.Progress.verdict): a stuck leader does not renew, so it exits and the standby
    leads, even where no liveness probe would restart it."""

    def __init__(
        self,
        api: client.ApiClient,
        cfg: LeaseConfig,
        on_lost: Callable[[], None] | None = None,
        stuck: Callable[[], str] = lambda: "",
    ) -> None:
        self.coord = client.CoordinationV1Api(api)
        self.cfg = cfg
        self.on_lost = on_lost or _exit_lost
        self.stuck = stuck
        self.leading = asyncio.Event()
        self._record: tuple | None = None  # (holder, renewTime) last seen
        self._record_seen = 0.0  # monotonic time it was first seen
        self._lease: dict | None = None  # the Lease as last read or written

    # ---- one try (sync, in a worker thread) -----------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        cfg = self.cfg
        lease = self._lease if self.leading.is_set() else None  # a leader writes without reading
        if lease is None:
            lease = self._get()
            if lease is None:
                return self._create()
        spec = lease.get("spec") or {}
        record = (spec.get("holderIdentity"), spec.get("renewTime"))
        now = time.monotonic()
        if record != self._record:
            self._record, self._record_seen = record, now
        if not may_acquire(spec, cfg.identity, now - self._record_seen, cfg.duration):
            return False
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": cfg.name,
                "namespace": cfg.namespace,
                "resourceVersion": lease["metadata"]["resourceVersion"],
            },
            "spec": next_spec(spec, cfg.identity, cfg.duration, time.time()),
        }
        try:
            resp = self.coord.replace_namespaced_lease(
                cfg.name, cfg.namespace, body, _preload_content=False, _request_timeout=cfg.retry
            )
        except ApiException as e:
            self._lease = None
            if e.status == 409:  # someone else wrote it first: read it again next time
                return False
            raise
        self._lease = json.loads(resp.data)
        return True

    def _get(self) -> dict | None:
        try:
            resp = self.coord.read_namespaced_lease(
                self.cfg.name, self.cfg.namespace, _preload_content=False, _request_timeout=self.cfg.retry
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return json.loads(resp.data)

    def _create(self) -> bool:
        cfg = self.cfg
        body = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": cfg.name, "namespace": cfg.namespace},
            "spec": next_spec({}, cfg.identity, cfg.duration, time.time()),
        }
        try:
            resp = self.coord.create_namespaced_lease(
                cfg.namespace, body, _preload_content=False, _request_timeout=cfg.retry
            )
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        self._lease = json.loads(resp.data)
        return True

    def release(self) -> None:
        """On a clean exit: hand the Lease over at once (a follower takes it on its next look)."""
        if not self.leading.is_set() or self._lease is None:
            return
        spec = dict(self._lease.get("spec") or {})
        spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time(time.time()))
        body = dict(self._lease, spec=spec)
        try:
            self.coord.replace_namespaced_lease(
                self.cfg.name,
                self.cfg.namespace,
                body,
                _preload_content=False,
                _request_timeout=self.cfg.retry,
            )
            log.info("released the leader lease", extra={"lease": self._where()})
        except (ApiException, OSError) as e:  # it expires by itself
            log.warning("could not release the leader lease: %s", e, extra={"lease": self._where()})
        self.leading.clear()
        metrics.LEADER.set(0)

    # ---- the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        cfg = self.cfg
        log.info("waiting to lead", extra={"lease": self._where(), "identity": cfg.identity})
        while not self.leading.is_set():
            if await self._try():
                self.leading.set()
                metrics.LEADER.set(1)
                log.info("leading", extra={"lease": self._where(), "identity": cfg.identity})
            else:
                await asyncio.sleep(cfg.retry)
        renewed = time.monotonic()
        while True:
            await asyncio.sleep(cfg.retry)
            why = self.stuck()
            if why:
                log.error("not renewing the leader lease: %s", why, extra={"lease": self._where()})
            elif await self._try():
                renewed = time.monotonic()
                continue
            if time.monotonic() - renewed > cfg.renew_deadline:
                log.critical(
                    "lost the leader lease: not renewed for %.1fs; exiting so that only one replica acts%s",
                    time.monotonic() - renewed,
                    f" (stepping down: {why})" if why else "",
                    extra={"lease": self._where(), "identity": cfg.identity},
                )
                if why:  # stepping down, not cut off: hand the Lease over at once
                    try:
                        await asyncio.wait_for(asyncio.to_thread(self.release), cfg.retry * 2)
                    except (asyncio.TimeoutError, urllib3.exceptions.HTTPError, OSError) as e:
                        log.warning("leader lease not released: %s", e, extra={"lease": self._where()})
                self.leading.clear()
                metrics.LEADER.set(0)
                self.on_lost()
                return

    async def _try(self) -> bool:
        """One try; False when the API server could not be asked. urllib3 raises its own errors
        (MaxRetryError once the API server refused every connection retried), not OSError: one
        escaping here would end the election for good, a follower that never leads."""
        try:
            return await asyncio.wait_for(asyncio.to_thread(self.try_acquire_or_renew), self.cfg.retry * 2)
        except (ApiException, OSError, urllib3.exceptions.HTTPError, asyncio.TimeoutError, ValueError) as e:
            log.warning("leader lease: %s", e, extra={"lease": self._where()})
            self._lease = None
            return False

    def _where(self) -> str:
        return f"{self.cfg.namespace}/{self.cfg.name}"


def _exit_lost() -> None:
    logging.shutdown()
    os._exit(1)


def default_identity() -> str:
    """The pod's name where the chart sets POD_NAME, else host and PID."""
    return os.environ.get("POD_NAME") or f"{os.uname().nodename}-{os.getpid()}"
