"""Training progress from the rank-0 trainer, for HolmesJob.status.progress.

Sources, all reachable without cluster DNS:
- while the pod runs: its Prometheus endpoint at http://<podIP>:<metrics port>/metrics
  (gauges holmes_trainer_iteration, _loss, _tokens_per_second, _tflops_per_gpu, ...);
- once it has terminated: the last JSON metric line the trainer printed
  (``{"holmes": "done", "iteration": ..., ...}``), from the container's termination message or,
  failing that, the tail of its log (read by the caller through the API).
Parsing is pure; ``scrape`` is the only I/O here, and ``ProgressReader`` decides when to read.
Reads run on the reader's own few threads, never in the reconcile that asks for them: a
reconcile starts a read when one is due and takes the numbers of the last finished one (the
reader wakes the job when a read finishes). Trainers that answer slowly or not at all (a scrape
waits up to its timeout per socket operation) then hold those threads only, never the
reconciles' (asyncio's default executor, a handful of threads shared by every job).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from holmes.contract import trainer_metrics as wire
from holmes.contract.frameworks import HOLMES

from .core import framework_progress
from .core.child_names import LABEL_REPLICA
from .core.reconcile import owned
from .core.replicas import REPLICAS_READ as REPLICAS
from .core.summary import pod_attempt, pod_node_rank

log = logging.getLogger("holmes.operator")

# The trainer's names (holmes.contract.trainer_metrics), turned round: a gauge -> the key it sets
GAUGES = {gauge: key for key, gauge in wire.PROGRESS_GAUGES.items()}
KEYS = tuple(wire.PROGRESS_GAUGES)
STAGE_GAUGES = {gauge: key for key, gauge in wire.STAGE_GAUGES.items()}


def _clean(d: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in KEYS:
        v = d.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v:  # drop NaN
            out[k] = int(v) if k in wire.INTEGER_KEYS else round(float(v), 6)
    fabric = d.get(wire.FABRIC_WARNINGS)
    if isinstance(fabric, list) and fabric:
        out[wire.FABRIC_WARNINGS] = [str(m) for m in fabric if isinstance(m, str)][:20]
    stages = _clean_stages(d.get(wire.STAGES))
    if stages:
        out[wire.STAGES] = stages
    return out


def _clean_stages(rows: Any) -> list[dict[str, Any]]:
    """Per-stage rows with every number present, numbered 0..P-1 (else none: a partial scrape)."""
    if not isinstance(rows, list) or len(rows) > 1024:
        return []
    keys = (wire.STAGE_LABEL, *wire.STAGE_GAUGES)
    out = []
    for r in rows:
        if not isinstance(r, Mapping) or not all(isinstance(r.get(k), (int, float)) for k in keys[:5]):
            return []
        out.append(
            {
                k: int(r[k]) if k in wire.STAGE_INTEGER_KEYS else round(float(r[k]), 6)
                for k in keys
                if isinstance(r.get(k), (int, float)) and r[k] == r[k]
            }
        )
    out.sort(key=lambda r: r[wire.STAGE_LABEL])
    return out if [r[wire.STAGE_LABEL] for r in out] == list(range(len(out))) else []


def fabric_warning(kind: str, count: int) -> str:
    """A running trainer's fabric problems of one kind, as status.progress.fabricWarnings says it
    until the done line brings each message (the metrics port carries counts only)."""
    return (
        f"fabricCheck warn: {count} {wire.FABRIC_KINDS[kind]} (the rank-0 trainer's start line in "
        "its log lists each one)"
    )


def from_prometheus(text: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    fabric: list[str] = []
    stages: dict[str, dict[str, Any]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in GAUGES and not s.labels:
                values[GAUGES[s.name]] = s.value
            elif (
                s.name == wire.FABRIC_GAUGE
                and s.value
                and s.labels.get(wire.FABRIC_KIND_LABEL) in wire.FABRIC_KINDS
            ):
                fabric.append(fabric_warning(s.labels[wire.FABRIC_KIND_LABEL], int(s.value)))
            elif s.name in STAGE_GAUGES and s.labels.get(wire.STAGE_LABEL, "").isdigit():
                stage = s.labels[wire.STAGE_LABEL]
                row = stages.setdefault(stage, {wire.STAGE_LABEL: int(stage)})
                row[STAGE_GAUGES[s.name]] = s.value
    values[wire.FABRIC_WARNINGS] = sorted(fabric)
    values[wire.STAGES] = list(stages.values())
    for unset in ("evalLoss", "checkpointIteration"):  # 0 until the first evaluation / save
        if values.get(unset) == 0:
            values.pop(unset)
    if values.get("iteration", 0) < 1:  # gauges read 0 until the first iteration (numbered from 1)
        return {}
    return _clean(values)


def from_json_lines(message: str | None) -> dict[str, Any]:
    """The last JSON metric line of a termination message or log tail (other text is ignored)."""
    for line in reversed((message or "").strip().splitlines()):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get(wire.EVENT_KEY) in wire.PROGRESS_EVENTS:
            return _clean(rec)
    return {}


def terminated(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def metrics_port_of(pod: Mapping[str, Any], default: int) -> int:
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == "metrics" and isinstance(p.get("containerPort"), int):
                return p["containerPort"]
    return default


def from_pod(pod: Mapping[str, Any], metrics_port: int, timeout: float = 1.0) -> dict[str, Any]:
    """Progress of a rank-0 pod: its termination message when terminated, else a scrape of its
    metrics port (the container port named "metrics", else ``metrics_port``)."""
    st = pod.get("status") or {}
    for cs in st.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            found = from_json_lines(term.get("message"))
            if found:
                return found
    ip = st.get("podIP")
    if st.get("phase") != "Running" or not ip:
        return {}
    return scrape(f"http://{ip}:{metrics_port_of(pod, metrics_port)}/metrics", timeout)


MAX_SCRAPE_BYTES = 1 << 20  # the pod runs the job author's code: read no more than this


def scrape(url: str, timeout: float = 1.0, limit: int = MAX_SCRAPE_BYTES) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (pod IP, http)
            body = r.read(limit + 1)
        if len(body) > limit:
            return {}  # not the trainer's few gauges: ignore it rather than parse megabytes
        return from_prometheus(body.decode("utf-8", "replace"))
    except (OSError, ValueError):
        return {}  # not listening yet, or gone: try again next time


FRAMEWORK_TAIL_LINES = 200  # an external framework's iteration line among its other output


READ_WORKERS = 4  # the reader's threads: at most this many trainers are read at once
Key = tuple[str, str]  # (namespace, name) of a job


class ProgressReader:
    """Each job's rank-0 trainer, read at most once per ``interval`` seconds while it runs, and
    its last line once it has ended; on ``workers`` threads of its own, one read per job at a
    time. ``on_read(key)`` is called (from a reader thread) when a job's read has finished, so
    its loop reconciles again to publish the numbers."""

    def __init__(
        self,
        metrics_port: int,
        interval: float,
        on_read: Callable[[Key], None] = lambda key: None,
        workers: int = READ_WORKERS,
    ) -> None:
        self.metrics_port, self.interval, self.on_read = metrics_port, interval, on_read
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="holmes-progress")
        self._lock = threading.Lock()
        # job -> (when its trainer was last read, the uids of the ended reporters read last)
        self._read: dict[Key, tuple] = {}
        self._running: dict[Key, Future] = {}  # the job's read under way
        self._found: dict[Key, tuple[str, dict]] = {}  # a finished read: (rank-0 pod uid, numbers)

    def forget(self, key: Key) -> None:
        with self._lock:
            self._read.pop(key, None)
            self._found.pop(key, None)
            self._running.pop(key, None)  # a read under way finishes into nothing

    def close(self) -> None:
        """Stop reading: queued reads are dropped, those under way end within their timeout."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def read(self, job: Mapping, pods: list[dict], log_tail: Callable[..., str]) -> dict | None:
        """The numbers of the job's last finished read, once (None: nothing new); starts a read
        when one is due. Never waits for a trainer. ``log_tail``: the ended rank-0 pod's log
        tail, from the API server of its cluster (read on the reader's thread too).

        Once every reporter has ended, their last lines are read here, in the caller's thread:
        they come from the pods' statuses and the API server, not from a trainer that may hang,
        and the reconcile that sees the pods ended writes the job's final status, which must
        carry them (a read still under way is dropped: these numbers are later)."""
        pod = rank0(job, pods)
        if pod is None:
            return None
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        uid = pod["metadata"].get("uid")
        others = replica_reporters(job, pods)  # acrossIslands replicas: each replica's rank 0
        reporters = [pod, *others.values()]
        # an ended reporter's last line is read once; each replica's rank 0 may end after rank 0's
        done = frozenset(p["metadata"].get("uid") for p in reporters if terminated(p))
        final = len(done) == len(reporters)
        with self._lock:
            of, found = self._found.pop(key, (None, None))
            if of != uid:  # read from a pod of an earlier attempt: not this one's numbers
                found = None
            last, last_done = self._read.get(key, (None, None))
            recent = last is not None and time.monotonic() - last < self.interval
            if done == last_done and (final or recent):
                return found
            if key in self._running and not final:
                return found
            self._read[key] = (time.monotonic(), done)
            if final:
                self._running.pop(key, None)  # a read under way finishes into nothing
            else:
                try:
                    fut = self._pool.submit(self._numbers_of, job, pod, others, log_tail)
                except RuntimeError:  # closed: the operator is stopping
                    return found
                self._running[key] = fut
        if final:
            try:
                return self._numbers_of(job, pod, others, log_tail)
            except Exception as e:  # noqa: BLE001 (a bug, not a slow trainer: logged, not fatal)
                log.warning("reading a trainer's progress failed: %s", e, extra={"job": "/".join(key)})
                return found
        fut.add_done_callback(lambda f: self._finished(key, str(uid), f))
        return found

    def _finished(self, key: Key, uid: str, fut: Future) -> None:
        with self._lock:
            if self._running.get(key) is not fut:
                return  # forgotten meanwhile (the job was deleted)
            del self._running[key]
            if fut.cancelled():
                return
            exc = fut.exception()
            if exc is None:
                self._found[key] = (uid, fut.result())
        if exc is not None:  # a bug, not a slow trainer: the next due read tries again
            log.warning("reading a trainer's progress failed: %s", exc, extra={"job": "/".join(key)})
            return
        self.on_read(key)

    def _numbers_of(
        self, job: Mapping, pod: Mapping[str, Any], others: Mapping[int, dict], log_tail: Callable[..., str]
    ) -> dict:
        framework = framework_of(job)
        if framework != HOLMES:  # no metrics port: the framework's own iteration lines
            return framework_progress.from_log(framework, log_tail(pod, lines=FRAMEWORK_TAIL_LINES))
        found = self.numbers(pod, terminated(pod), log_tail)
        if others:  # acrossIslands replicas: each replica's rank 0 reports its own world
            found = dict(found or {})
            found[REPLICAS] = {0: {k: v for k, v in found.items() if k != REPLICAS}}
            for r, p in others.items():
                found[REPLICAS][r] = self.numbers(p, terminated(p), log_tail)
        return found

    def numbers(self, pod: Mapping[str, Any], ended: bool, log_tail: Callable[..., str]) -> dict[str, Any]:
        found = from_pod(pod, self.metrics_port)
        if not found and ended:  # the trainer's last line, from its log
            found = from_json_lines(log_tail(pod))
        return found


def replica_reporters(job: Mapping, pods: list[dict]) -> dict[int, dict]:
    """Replicas 1.. of an acrossIslands replicas job: each replica's first pod (its rank 0)."""
    st = job.get("status") or {}
    out: dict[int, dict] = {}
    for p in owned(pods, job["metadata"].get("uid")):
        r = ((p.get("metadata") or {}).get("labels") or {}).get(LABEL_REPLICA, "")
        if pod_attempt(p) != st.get("attempt") or not r.isdigit() or int(r) == 0:
            continue
        rank = pod_node_rank(p)
        if rank is not None and (int(r) not in out or rank < (pod_node_rank(out[int(r)]) or 0)):
            out[int(r)] = p
    return out


def framework_of(job: Mapping) -> str:
    return (job.get("spec") or {}).get("framework") or HOLMES


def rank0(job: Mapping, pods: list[dict]) -> dict | None:
    """The current attempt's pod that reports progress, of a launched, unfinished job (None
    otherwise): rank 0's, or for an external framework the pod whose log carries its iteration
    lines (spec.framework: core/framework_progress.py)."""
    st = job.get("status") or {}
    if not st.get("launched") or st.get("phase") in ("Succeeded", "Failed"):
        return None
    reporter = 0
    if framework_of(job) != HOLMES:
        nodes = int((st.get("layout") or {}).get("nodes") or 1)
        reporter = framework_progress.reporting_node_rank(framework_of(job), nodes)
    return next(
        (
            p
            for p in owned(pods, job["metadata"].get("uid"))
            if pod_attempt(p) == st.get("attempt") and pod_node_rank(p) == reporter
        ),
        None,
    )
