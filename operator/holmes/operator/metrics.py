"""Prometheus metrics of the operator (prometheus-client's default registry, so the process
collector's memory and CPU series come along)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PHASES = ("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended")

JOBS = Gauge("holmes_jobs", "HolmesJobs known to this operator, by phase", ["phase"])
RECONCILE_SECONDS = Histogram(
    "holmes_reconcile_duration_seconds",
    "Time of one reconcile of a HolmesJob",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 1.5, 2, 2.5, 5, 10, 30),
)
PLANNING_SECONDS = Histogram(
    "holmes_planning_duration_seconds",
    "Time of a reconcile decision that searched for a layout (placement: its sizes, the queue "
    "ahead, the layout search; rendering the pods after it)",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10),
)
PODS_CREATED = Counter("holmes_pods_created_total", "Pods created for HolmesJobs")
RESTARTS = Counter("holmes_restarts_total", "Gang restarts after a pod failure")
FAILURES = Counter("holmes_job_failures_total", "HolmesJobs that ended Failed, by reason", ["reason"])
RECONCILE_ERRORS = Counter("holmes_reconcile_errors_total", "Reconciles that raised (retried with backoff)")
COST_MODEL_VALID = Gauge(
    "holmes_cost_model_valid",
    "1 while the --cost-model file in use is valid; 0 while it is "
    "unreadable or invalid (planning keeps the last good model)",
)
KUEUE_API_VERSION = Gauge(
    "holmes_kueue_api_version",
    "1 for the kueue.x-k8s.io version the operator uses for Workloads and ResourceFlavors "
    "(all 0: Kueue's API is not served)",
    ["version"],
)
COST_MODEL_RELOADS = Counter("holmes_cost_model_reloads_total", "Changed --cost-model files taken into use")


class PhaseTracker:
    """The phase of every job this operator serves, exported as one gauge per phase."""

    def __init__(self) -> None:
        self._phase: dict[tuple[str, str], str] = {}
        for p in PHASES:
            JOBS.labels(p).set(0)

    def set(self, key: tuple[str, str], phase: str | None) -> None:
        if phase is None:
            self._phase.pop(key, None)
        else:
            self._phase[key] = phase
        for p, n in self.counts().items():
            JOBS.labels(p).set(n)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(PHASES, 0)
        for p in self._phase.values():
            out[p] = out.get(p, 0) + 1
        return out
