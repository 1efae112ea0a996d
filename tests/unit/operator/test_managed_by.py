"""spec.managedBy (issue 51): a HolmesJob another controller runs (Kueue's MultiKueue) is left
alone by this cluster's operator: no reconcile, no status, no place in its capacity queue; one
Event says who runs it. The API server's rules: tests/e2e/operator/test_managed_by_cluster.py."""

from __future__ import annotations

import pytest
from kubernetes import client

from holmes.contract import SpecError, load_job
from holmes.contract.names import MANAGED_BY_HOLMES, MANAGED_BY_MULTIKUEUE
from holmes.operator import handlers, placement_facts
from holmes.operator.core import capacity, managed_by
from tests.helpers.operator.pipeline_world import waiting_job


def managed(job: dict, by: str) -> dict:
    job["spec"]["managedBy"] = by
    return job


def test_the_parser_takes_a_domain_prefixed_path_and_names_the_field_and_the_fix_otherwise():
    job = managed(waiting_job("a", 0), MANAGED_BY_MULTIKUEUE)
    spec = load_job(job)
    assert spec.managed_by == MANAGED_BY_MULTIKUEUE
    assert spec.to_spec()["managedBy"] == MANAGED_BY_MULTIKUEUE
    assert (
        load_job(waiting_job("b", 0)).managed_by == ""
        and "managedBy" not in load_job(waiting_job("b", 0)).to_spec()
    )
    for bad in ("multikueue", "Kueue.x-k8s.io/multikueue", "kueue.x-k8s.io/", "a" * 60 + ".io/x", 7, ""):
        with pytest.raises(SpecError) as e:
            load_job(managed(waiting_job("c", 0), bad))
        (problem,) = e.value.problems
        assert problem.startswith("spec.managedBy: must be a domain-prefixed path of at most 63 characters")
        assert f"{MANAGED_BY_MULTIKUEUE} for Kueue's MultiKueue, or leave it out" in problem


@pytest.mark.parametrize(
    "value, other",
    [
        (None, ""),
        (MANAGED_BY_HOLMES, ""),
        (MANAGED_BY_MULTIKUEUE, MANAGED_BY_MULTIKUEUE),
        ("example.com/batch-dispatcher", "example.com/batch-dispatcher"),
        ("not a name", ""),  # Holmes' to refuse (InvalidSpec), not someone else's to run
    ],
)
def test_who_runs_the_job(value, other):
    job = waiting_job("a", 0)
    if value is not None:
        managed(job, value)
    assert managed_by.elsewhere(job) == other


def test_the_reconcile_leaves_a_job_managed_elsewhere_alone_and_says_so_once(monkeypatch):
    """No observe/decide/write pass (no Workload, pods, ConfigMap or status); the loop ends
    (None); one Event per job, not one per wake-up. A job of Holmes' own goes through."""
    rt = handlers.Runtime(client.ApiClient(), placement_facts.builtin_cost_model())
    passes, events = [], []

    def run(job, nodes, refused):
        passes.append(job["metadata"]["name"])
        raise RuntimeError("stop here: the pass ran")

    monkeypatch.setattr(rt.pipeline, "run", run)
    monkeypatch.setattr(handlers.kopf, "event", lambda obj, **kw: events.append(kw))
    rt.caches.jobs.put(managed(waiting_job("remote", 0), MANAGED_BY_MULTIKUEUE))
    rt.caches.jobs.put(waiting_job("local", 1))
    try:
        assert rt.reconcile("ns", "remote", []) is None
        assert rt.reconcile("ns", "remote", []) is None
        assert passes == []
        assert [e["reason"] for e in events] == ["ManagedElsewhere"]
        assert events[0]["type"] == "Normal"
        assert events[0]["message"].startswith(
            "spec.managedBy is kueue.x-k8s.io/multikueue: Kueue's MultiKueue runs it on a worker cluster"
        )
        with pytest.raises(RuntimeError, match="the pass ran"):
            rt.reconcile("ns", "local", [])
        assert passes == ["local"]
    finally:
        for pool in rt.workers.values():
            pool.shutdown(wait=False)


def test_a_job_managed_elsewhere_holds_no_place_in_this_clusters_queue():
    """MultiKueue copies the worker's status (phase Pending, not launched) into the manager's
    job: it must not count as a waiting job ahead of this cluster's own."""
    remote = managed(waiting_job("remote", 0), MANAGED_BY_MULTIKUEUE)
    remote["status"] = {"phase": "Pending"}
    plain = waiting_job("plain", 1)
    me = waiting_job("me", 2)
    ahead = capacity.shared_state(me, capacity.Workloads(jobs=[remote, plain, me]), {}).ahead
    assert [w.job.split("/")[1] for w in ahead] == ["plain"]
