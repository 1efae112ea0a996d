"""Prometheus metrics of the operator (prometheus-client's default registry, so the process
collector's memory and CPU series come along). Per-job series carry the job's namespace as
``job_namespace`` (a tenant's view; bounded by the namespaces the operator serves), never a job
name or free text. Not ``namespace``: that is the scrape target's own label (the operator's
namespace), which the chart's ServiceMonitor keeps (honorLabels: false) so that no series can
claim a tenant's namespace; a label of that name here would arrive as exported_namespace.
Only the leader acts: a standby reports ``holmes_leader`` 0 and no jobs, so aggregate with
``max``/``sum by (job_namespace, phase)`` over the replicas, or keep ``holmes_leader == 1``.
charts/holmes's PrometheusRule and dashboard use these names (tests/unit/packaging check them)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PHASES = ("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended")

JOBS = Gauge(
    "holmes_jobs",
    "HolmesJobs this operator acts on, by namespace and phase (0 on a standby)",
    ["job_namespace", "phase"],
)
LEADER = Gauge(
    "holmes_leader",
    "1 while this replica acts on jobs (holds the leader Lease, or runs without --leader-elect); "
    "0 while it stands by",
)
RECONCILE_SECONDS = Histogram(
    "holmes_reconcile_duration_seconds",
    "Time of one reconcile of a HolmesJob",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 2.5, 5, 10, 30),
)
RECONCILE_WAIT_SECONDS = Histogram(
    "holmes_reconcile_wait_seconds",
    "Time a due reconcile waited for a worker, by pool (launching: jobs not launched yet; "
    "tracking: the others)",
    ["pool"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30),
)
PLANNING_SECONDS = Histogram(
    "holmes_planning_duration_seconds",
    "Time of a reconcile decision that searched for a layout (placement: its sizes, the queue "
    "ahead, the layout search; rendering the pods after it)",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10),
)
PLACEMENT_RETRIES = Counter(
    "holmes_placement_retries_total",
    "Decisions that claimed capacity decided again because another job claimed some first "
    "(optimistic placement: plans run outside the placement lock)",
)
PODS_CREATED = Counter("holmes_pods_created_total", "Pods created for HolmesJobs", ["job_namespace"])
RESTARTS = Counter("holmes_restarts_total", "Gang restarts (all reasons)", ["job_namespace"])
REPLANS = Counter(
    "holmes_replans_total", "Re-plans from measured stage speeds (parallelism.replan)", ["job_namespace"]
)
FAILURES = Counter(
    "holmes_job_failures_total", "HolmesJobs that ended Failed, by reason", ["job_namespace", "reason"]
)
OLDEST_RECONCILE = Gauge(
    "holmes_oldest_reconcile_seconds",
    "Seconds the oldest reconcile in progress has run (0 when none runs); over the reconcile "
    "bound (--reconcile-bound) the liveness probe fails (liveness.py)",
)
RECONCILE_ERRORS = Counter("holmes_reconcile_errors_total", "Reconciles that raised (retried with backoff)")
COST_MODEL_VALID = Gauge(
    "holmes_cost_model_valid",
    "1 while the --cost-model file in use is valid; 0 while it is "
    "unreadable or invalid (planning keeps the last good model)",
)
# An _info series (value 1, the fact in its label), so that a query joins on it or reads it
# without comparing values: one series, version="none" while Kueue's API is not served.
KUEUE_API_INFO = Gauge(
    "holmes_kueue_api_info",
    "The kueue.x-k8s.io version the operator uses for Workloads and ResourceFlavors, in the "
    "label version (none: Kueue's API is not served); always 1",
    ["version"],
)
NO_KUEUE = "none"
COST_MODEL_RELOADS = Counter("holmes_cost_model_reloads_total", "Changed --cost-model files taken into use")
BUILD_INFO = Gauge("holmes_build_info", "The operator's release, in the label version; always 1", ["version"])


def set_kueue_api(version: str | None) -> None:
    """holmes_kueue_api_info: the one series of the version in use."""
    KUEUE_API_INFO.clear()
    KUEUE_API_INFO.labels(version or NO_KUEUE).set(1)


class PhaseTracker:
    """The phase of every job this operator acts on, exported as one gauge per namespace and
    phase; a namespace's series go when its last job does."""

    def __init__(self) -> None:
        self._phase: dict[tuple[str, str], str] = {}
        self._exported: set[tuple[str, str]] = set()

    def set(self, key: tuple[str, str], phase: str | None) -> None:
        if phase is None:
            self._phase.pop(key, None)
        else:
            self._phase[key] = phase
        series = {(ns, p): n for ns, phases in self.by_namespace().items() for p, n in phases.items()}
        for gone in self._exported - set(series):
            JOBS.remove(*gone)
        for labels, n in series.items():
            JOBS.labels(*labels).set(n)
        self._exported = set(series)

    def by_namespace(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for (ns, _), p in self._phase.items():
            row = out.setdefault(ns, dict.fromkeys(PHASES, 0))
            row[p] = row.get(p, 0) + 1
        return out

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(PHASES, 0)
        for p in self._phase.values():
            out[p] = out.get(p, 0) + 1
        return out
