"""A good citizen of a shared cluster (issue 50), on the real API server and kube-scheduler:

- every resource a pod asks for is counted before it is pinned: a node without an extended
  resource the template requests is never planned (before, its pod stayed Pending for ever);
- a pinned pod the scheduler refuses (here: the node's extended resource is held by a pod in a
  namespace the operator does not read, which no count can see) gives the gang's nodes back after
  runPolicy.schedulingTimeoutSeconds and the job plans without that node: it reaches Succeeded
  with backoffLimit 0 (a disruption, not a failure);
- a gang over its namespace's ResourceQuota creates no pod, names the quota, and starts once the
  quota controller's status.used says it fits.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
from holmes_dev.jobs import tiny_job

from tests.helpers.operator.cluster_helpers import (
    HOLD,
    apply,
    condition,
    events_of,
    get_job,
    hold,
    pods_of,
    running_operator,
    wait_for,
    wait_phase,
)

pytestmark = pytest.mark.timeout(300)
WIDGET = "example.com/widget"
EAST = ("ib-0", "ib-1", "eth-0")


@pytest.fixture
def operator(crd, namespace, tmp_path):
    yield from running_operator(crd, namespace, tmp_path, tail=80)


def set_widgets(cluster, counts: dict[str, str | None]) -> None:
    """Give nodes an extended resource (None: take it away), as a device plugin would."""
    for node, n in counts.items():
        patch = {"status": {"capacity": {WIDGET: n}, "allocatable": {WIDGET: n}}}
        cluster.kubectl(
            "patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(patch)
        )


@pytest.fixture
def widgets(crd):
    yield lambda counts: set_widgets(crd, counts)
    set_widgets(crd, dict.fromkeys(EAST, None))


def east_job(namespace, name, **kw):
    job = tiny_job(name, namespace, count=2, gpus=2, command=["sh", "-c", "sleep 2"], **kw)
    tspec = job["spec"]["template"]["spec"]
    tspec["nodeSelector"] = {"holmes.dev/cluster": "east"}
    tspec["containers"][0]["resources"] = {"limits": {WIDGET: "1"}}
    return job


def pinned(pod) -> str:
    return pod["metadata"]["annotations"]["holmes.dev/node"]


def test_a_node_without_a_resource_the_pods_request_is_never_planned(crd, namespace, operator, widgets):
    widgets({"ib-0": "1", "eth-0": "1"})  # ib-1 has none: the scheduler could never bind there
    apply(crd, east_job(namespace, "widget", run_policy={"backoffLimit": 0}))
    job = wait_phase(crd, namespace, "widget", "Succeeded", timeout=120, op=operator)
    assert job["status"]["restarts"] == 0 and job["status"]["attempt"] == 1
    assert {n for s in job["status"]["layout"]["stages"] for n in s["nodes"]} == {"eth-0", "ib-0"}
    assert "PodUnschedulable" not in {e["reason"] for e in events_of(crd, namespace, "widget")}


def test_a_pod_the_scheduler_refuses_replans_without_its_node_and_succeeds(crd, namespace, operator, widgets):
    widgets(dict.fromkeys(EAST, "1"))
    # another team's pod holds ib-1's widget, in a namespace this operator does not read
    blocker = f"blocker-{uuid.uuid4().hex[:6]}"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": blocker, "namespace": "default"},
        "spec": {
            "nodeName": "ib-1",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "c",
                    "image": "x",
                    "command": ["sleep", "600"],
                    "resources": {"limits": {WIDGET: "1"}},
                }
            ],
        },
    }
    apply(crd, pod)
    try:
        timeout = 10
        job = east_job(
            namespace, "refused", run_policy={"backoffLimit": 0, "schedulingTimeoutSeconds": timeout}
        )
        apply(crd, job)

        def refused_pod():
            for p in pods_of(crd, namespace, "refused"):
                c = next((c for c in p["status"].get("conditions") or [] if c["type"] == "PodScheduled"), {})
                if c.get("reason") == "Unschedulable":
                    return p, c
            return None

        first, cond = wait_for("a pod the scheduler refuses", refused_pod, timeout=90, op=operator)
        assert pinned(first) == "ib-1" and f"Insufficient {WIDGET}" in cond["message"]
        seen = time.monotonic()
        refused = wait_for(
            "the refused node in the status",
            lambda: (get_job(crd, namespace, "refused").get("status") or {}).get("unschedulableNodes"),
            timeout=60,
            op=operator,
        )
        assert list(refused) == ["ib-1"]
        assert refused["ib-1"]["message"].startswith(f"pod {first['metadata']['name']}: ")
        replanned = time.monotonic() - seen
        done = wait_phase(crd, namespace, "refused", "Succeeded", timeout=150, op=operator)
        took = time.monotonic() - seen
        st = done["status"]
        assert st["restartsByReason"] == {"disruption": 1} and st["attempt"] == 2
        assert {n for s in st["layout"]["stages"] for n in s["nodes"]} == {"eth-0", "ib-0"}
        ev = next(e for e in events_of(crd, namespace, "refused") if e["reason"] == "PodUnschedulable")
        assert "node ib-1" in ev["message"] and f"Insufficient {WIDGET}" in ev["message"]
        assert "planning again without ib-1" in ev["message"]
        print(
            f"refused on ib-1: re-planned after {replanned:.1f}s, Succeeded after {took:.1f}s "
            f"(timeout {timeout}s)"
        )
    finally:
        crd.kubectl("delete", "pod", blocker, "-n", "default", "--wait=false", check=False)


def gpu_quota(namespace, hard):
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "team-gpus", "namespace": namespace},
        "spec": {"hard": {"requests.nvidia.com/gpu": str(hard)}},
    }


def test_a_gang_over_quota_creates_no_pod_and_starts_when_the_quota_frees(
    crd, namespace, operator, shared_dir
):
    apply(crd, gpu_quota(namespace, 3))
    wait_for(
        "the quota controller to sync the quota",
        lambda: crd.get_json("resourcequota", "team-gpus", "-n", namespace).get("status", {}).get("hard"),
        timeout=30,
    )
    first = tiny_job("first", namespace, count=1, gpus=2, command=HOLD)
    go = hold(first, shared_dir)  # the first job runs until this file exists
    apply(crd, first)
    wait_phase(crd, namespace, "first", "Running", timeout=90, op=operator)
    apply(crd, tiny_job("second", namespace, count=2, gpus=1, command=["sh", "-c", "sleep 1"]))

    def waiting():
        job = get_job(crd, namespace, "second")
        c = condition(job, "Reconciling") if job else {}
        return c if c.get("reason") == "WaitingForQuota" else None

    c = wait_for("second waits for the quota", waiting, timeout=60, op=operator)
    assert c["message"].startswith(
        "ResourceQuota team-gpus: the gang's 2 pod(s) need requests.nvidia.com/gpu 2, 2 of 3 used"
    ), c["message"]
    end = time.monotonic() + 10  # and it stays so, creating nothing the quota would refuse
    while time.monotonic() < end:
        assert not pods_of(crd, namespace, "second")
        time.sleep(0.5)
    st = get_job(crd, namespace, "second")["status"]
    assert "createFailures" not in st and st["phase"] == "Pending"
    assert "ChildCreateFailed" not in {e["reason"] for e in events_of(crd, namespace, "second")}
    go.touch()  # the first job ends: the quota controller gives its GPUs back
    freed = time.monotonic()
    wait_phase(crd, namespace, "first", "Succeeded", timeout=60, op=operator)
    job = wait_phase(crd, namespace, "second", "Succeeded", timeout=120, op=operator)
    assert job["status"]["attempt"] == 1 and job["status"]["restarts"] == 0
    print(f"second started and finished {time.monotonic() - freed:.1f}s after the quota freed")
