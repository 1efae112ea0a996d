"""A tenant cannot raise its job above what its PriorityClass grants in Holmes' queue (issue 50,
item 2), on the real API server: with the cluster full, a job setting runPolicy.priority to the
highest int32 (its namespace not in --raw-priority-namespaces) and a later one whose PriorityClass
is worth 1000 wait; the first is Stalled (PolicyViolation) naming the fix and never gets a pod,
the second runs when the capacity frees. Where the operator's policy allows it, the raw number
is accepted. (In the real Kueue's queue: test_kueue_real.py.)"""

from __future__ import annotations

import json

import pytest
from holmes_dev.jobs import tiny_job

from localkube.operatorproc import OperatorProcess
from tests.helpers.operator.cluster_helpers import (
    SLEEP,
    apply,
    condition,
    get_job,
    pods_of,
    running_operator,
    wait_for,
    wait_phase,
)

pytestmark = pytest.mark.timeout(300)
HIGHEST = 2**31 - 1


@pytest.fixture
def priority_class(crd, namespace):
    name = f"team-{namespace}"
    pc = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}}
    crd.kubectl("apply", "-f", "-", input=json.dumps({**pc, "value": 1000}))
    yield name
    crd.kubectl("delete", "priorityclass", name, check=False)


@pytest.fixture
def operator(crd, namespace, tmp_path):
    yield from running_operator(crd, namespace, tmp_path)


def whole_cluster(name, namespace, **run_policy):
    """A job on four of the six nodes x 2 GPUs: one such runs at a time."""
    return tiny_job(
        name, namespace, count=4, gpus=2, command=SLEEP, run_policy={"backoffLimit": 0, **run_policy}
    )


def test_a_raw_priority_does_not_jump_holmes_queue(crd, namespace, priority_class, operator, tmp_path):
    apply(crd, whole_cluster("first", namespace))
    wait_phase(crd, namespace, "first", "Running", timeout=120, op=operator)
    apply(crd, whole_cluster("greedy", namespace, priority=HIGHEST))
    apply(crd, whole_cluster("fair", namespace, priorityClassName=priority_class))

    def stalled():
        c = condition(get_job(crd, namespace, "greedy") or {}, "Stalled")
        return c if c.get("status") == "True" else None

    c = wait_for("greedy stalled", stalled, op=operator)
    assert c["reason"] == "PolicyViolation", c
    assert c["message"].startswith(
        f"spec.runPolicy.priority: namespace {namespace} may not set a raw priority"
    )
    assert "--raw-priority-namespaces" in c["message"] and "priorityClassName" in c["message"]
    wait_for(
        "fair waiting for capacity",
        lambda: (
            condition(get_job(crd, namespace, "fair") or {}, "Reconciling").get("reason")
            == "WaitingForCapacity"
            or None
        ),
        op=operator,
    )
    crd.kubectl("delete", "hj", "first", "-n", namespace, "--wait=true", "--timeout=60s")
    wait_phase(crd, namespace, "fair", "Running", timeout=120, op=operator)
    assert not pods_of(crd, namespace, "greedy")
    assert condition(get_job(crd, namespace, "greedy"), "Stalled")["reason"] == "PolicyViolation"

    # the operator's policy allows the namespace a raw priority: the job is accepted (it waits
    # for fair's nodes, ahead of any PriorityClass below the highest int32)
    operator.stop()
    allowed = OperatorProcess(
        crd.kubeconfig,
        [namespace],
        tmp_path / "allowed.log",
        extra=[f"--raw-priority-namespaces={namespace}"],
    ).start()
    try:
        job = wait_for(
            "greedy accepted",
            lambda: (lambda j: j if condition(j, "Stalled").get("status") == "False" else None)(
                get_job(crd, namespace, "greedy")
            ),
            op=allowed,
        )
        assert condition(job, "Reconciling")["reason"] == "WaitingForCapacity", job["status"]
    finally:
        allowed.stop()
        print(allowed.tail(40))
