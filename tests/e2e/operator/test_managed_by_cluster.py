"""spec.managedBy on the real API server and the real Kueue (issue 51): the CRD's rules refuse a
malformed value and any change of it at apply time; a HolmesJob that MultiKueue manages
(``kueue.x-k8s.io/multikueue``) gets from this cluster's operator only the Workload MultiKueue
dispatches (owned by the job, one PodSet of nodes.count pods; no pods, no ConfigMap, no status;
one ManagedElsewhere Event) while one without it, in the same LocalQueue, gets its Workload and
runs. The decisions themselves: tests/unit/operator/test_managed_by.py, test_multikueue.py.

A real MultiKueue dispatching the job to a second cluster: test_multikueue_cluster.py."""

from __future__ import annotations

import json

import pytest
from holmes_dev.jobs import tiny_job

from holmes.contract.names import MANAGED_BY_MULTIKUEUE
from tests.helpers.operator.cluster_helpers import (
    SLEEP,
    apply,
    events_of,
    get_job,
    pods_of,
    running_operator,
    wait_for,
    wait_phase,
)
from tests.helpers.operator.kueue_real import kueue_objects, queued, workload

pytestmark = pytest.mark.timeout(420)


def managed(job: dict, by: str = MANAGED_BY_MULTIKUEUE) -> dict:
    job["spec"]["managedBy"] = by
    return job


def refused(cluster, *args: str) -> str:
    r = cluster.kubectl(*args, check=False)
    assert r.returncode != 0, f"kubectl {' '.join(args)} was accepted"
    return r.stderr


def test_the_crd_refuses_a_malformed_managed_by_and_any_change_of_it(crd, namespace):
    r = apply(crd, managed(tiny_job("odd", namespace), "multikueue"), check=False)
    assert r.returncode != 0
    assert "managedBy must be a domain-prefixed path of at most 63 characters" in r.stderr
    apply(crd, managed(tiny_job("remote", namespace, command=SLEEP)))
    apply(crd, tiny_job("plain", namespace, command=SLEEP))
    ns = ["-n", namespace]
    for args in (
        ["patch", "holmesjob", "remote", "--type=merge", "-p", '{"spec":{"managedBy":"example.com/other"}}'],
        ["patch", "holmesjob", "remote", "--type=json", "-p", '[{"op":"remove","path":"/spec/managedBy"}]'],
        [
            "patch",
            "holmesjob",
            "plain",
            "--type=merge",
            "-p",
            json.dumps({"spec": {"managedBy": MANAGED_BY_MULTIKUEUE}}),
        ],
    ):
        assert "managedBy is immutable" in refused(crd, *args, *ns)
    assert get_job(crd, namespace, "remote")["spec"]["managedBy"] == MANAGED_BY_MULTIKUEUE
    assert "managedBy" not in get_job(crd, namespace, "plain")["spec"]
    # an edit of anything else is still allowed
    crd.kubectl(
        "patch", "holmesjob", "remote", "--type=merge", "-p", '{"spec":{"runPolicy":{"suspend":true}}}', *ns
    )


@pytest.fixture
def queues(cluster, real_kueue, namespace):
    objs = kueue_objects(namespace, 4)[:3]  # a flavor, a ClusterQueue of 4 GPUs, the LocalQueue
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    yield
    cluster.kubectl(
        "delete", "holmesjob", "--all", "-n", namespace, "--wait=true", "--timeout=60s", check=False
    )
    for o in reversed(objs):
        kind = o["kind"].lower() + "s.kueue.x-k8s.io"
        args = ["-n", namespace] if o["kind"] == "LocalQueue" else []
        cluster.kubectl("delete", kind, o["metadata"]["name"], *args, "--wait=false", check=False)


@pytest.fixture
def operator(crd, real_kueue, namespace, tmp_path):
    yield from running_operator(crd, namespace, tmp_path, extra=["--progress-interval=1"], tail=60)


def test_a_job_multikueue_manages_is_left_alone_while_its_neighbour_runs(
    cluster, queues, operator, namespace
):
    """Both jobs in one LocalQueue with room for both: the remote one (applied first) gets its
    Workload for MultiKueue to dispatch (this cluster's Kueue has no MultiKueue check: it admits
    it, and still no pod runs here) and no pods, ConfigMap or status, and the Event that says
    who runs it; the local one is admitted by Kueue and its pods run."""
    apply(cluster, queued(managed(tiny_job("remote", namespace, count=2, command=SLEEP))))
    apply(cluster, queued(tiny_job("local", namespace, count=2, command=SLEEP)))
    wait_for("local's Workload", lambda: workload(cluster, namespace, "local"), op=operator)
    wait_phase(cluster, namespace, "local", "Running", timeout=120, op=operator)
    ev = wait_for(
        "the ManagedElsewhere Event",
        lambda: [e for e in events_of(cluster, namespace, "remote") if e["reason"] == "ManagedElsewhere"],
        op=operator,
    )
    assert len(ev) == 1 and ev[0].get("count") in (None, 1), ev
    assert ev[0]["message"].startswith(f"spec.managedBy is {MANAGED_BY_MULTIKUEUE}: Kueue's MultiKueue")
    wl = workload(cluster, namespace, "remote")
    assert wl is not None, "no Workload for MultiKueue to dispatch"
    (owner,) = [r for r in wl["metadata"].get("ownerReferences") or [] if r.get("controller")]
    assert (owner["kind"], owner["name"]) == ("HolmesJob", "remote")
    assert [p["count"] for p in wl["spec"]["podSets"]] == [2]
    assert pods_of(cluster, namespace, "remote") == []
    assert "status" not in get_job(cluster, namespace, "remote")
    cms = cluster.get_json("configmaps", "-n", namespace, "-l", "holmes.dev/job-name=remote")["items"]
    assert cms == []
    assert len(pods_of(cluster, namespace, "local")) == 2
