"""A HolmesJob reads correctly under kstatus (Flux) and the Argo CD health script, on statuses
shaped exactly as the operator writes them. The same rules are applied to statuses written by
the real operator in tests/e2e/packaging/test_chart_cluster.py."""

from __future__ import annotations

import pytest

from tests.helpers.packaging.health_rules import argocd, kstatus


def cond(type_, status, reason="R", message=""):
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }


def job(generation=1, **status):
    obj = {
        "apiVersion": "holmes.dev/v1alpha1",
        "kind": "HolmesJob",
        "metadata": {"name": "j", "namespace": "ns", "generation": generation},
    }
    if status:
        obj["status"] = status
    return obj


FINISHED = job(
    observedGeneration=1,
    phase="Succeeded",
    conditions=[
        cond("Ready", "True", "AllPodsSucceeded", "all 2 pods finished training"),
        cond("Reconciling", "False", "Succeeded"),
        cond("Stalled", "False", "Healthy"),
        cond("Succeeded", "True", "AllPodsSucceeded", "all 2 pods finished training"),
    ],
)
RUNNING = job(
    observedGeneration=1,
    phase="Running",
    progress={"iteration": 7, "loss": 3.21},
    conditions=[
        cond("Ready", "True", "AllPodsRunning", "attempt 1: 2 pods running"),
        cond("Reconciling", "False", "Running"),
        cond("Stalled", "False", "Healthy"),
    ],
)
STARTING = job(
    observedGeneration=1,
    phase="Pending",
    conditions=[
        cond("Ready", "False", "PodsStarting", "1/2 pods running"),
        cond("Reconciling", "True", "PodsStarting", "1/2 pods running"),
        cond("Stalled", "False", "Healthy"),
    ],
)
STALLED = job(
    observedGeneration=1,
    phase="Pending",
    conditions=[
        cond("Ready", "False", "InvalidSpec"),
        cond("Reconciling", "False", "Pending"),
        cond(
            "Stalled", "True", "InvalidSpec", "spec.model.hiddenSize 100 is not divisible by attentionHeads 3"
        ),
    ],
)
FAILED = job(
    observedGeneration=1,
    phase="Failed",
    conditions=[
        cond("Ready", "False", "BackoffLimitExceeded"),
        cond("Stalled", "True", "BackoffLimitExceeded", "3 restarts"),
        cond("Failed", "True", "BackoffLimitExceeded", "backoffLimit 3 reached: pod x failed"),
    ],
)
SUSPENDED = job(
    observedGeneration=1,
    phase="Suspended",
    conditions=[
        cond("Ready", "False", "Suspended"),
        cond("Stalled", "False", "Healthy"),
        cond("Suspended", "True", "Suspended", "runPolicy.suspend is true"),
    ],
)
EDITED = job(generation=2, **RUNNING["status"])  # spec edited, operator not caught up yet
NEW = job()  # no status yet


@pytest.mark.parametrize(
    "obj, expected",
    [
        (FINISHED, "Current"),
        (RUNNING, "Current"),
        (STARTING, "InProgress"),
        (STALLED, "Failed"),
        (FAILED, "Failed"),
        (SUSPENDED, "Current"),
        (EDITED, "InProgress"),
        # kstatus reads a resource without any status as Current (no abnormal condition yet)
        (NEW, "Current"),
    ],
)
def test_kstatus(obj, expected):
    assert kstatus(obj)[0] == expected


@pytest.mark.parametrize(
    "obj, expected, in_message",
    [
        (FINISHED, "Healthy", "finished training"),
        (RUNNING, "Progressing", "iteration 7, loss 3.21"),
        (STARTING, "Progressing", "1/2 pods running"),
        (STALLED, "Degraded", "not divisible by attentionHeads"),
        (FAILED, "Degraded", "backoffLimit 3 reached"),
        (SUSPENDED, "Suspended", "suspend"),
        (EDITED, "Progressing", "observe generation 2"),
        (NEW, "Progressing", "Waiting for the Holmes operator"),
    ],
)
def test_argocd_lua(obj, expected, in_message):
    status, message = argocd(obj)
    assert status == expected
    assert in_message in message


def test_kstatus_terminating():
    obj = job(observedGeneration=1, phase="Running")
    obj["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert kstatus(obj)[0] == "Terminating"
