"""docs/troubleshooting.md covers what the operator says: every reason it sets on a condition or
an Event has a section (found in the code: each CamelCase string of two words or more in
holmes.operator that is not a Kubernetes name it reads or writes), and every alert's
runbook_url names a section that exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

from tests.helpers.markdown import anchors

REPO = Path(__file__).resolve().parents[3]
PAGE = REPO / "docs" / "troubleshooting.md"
OPERATOR = REPO / "operator" / "holmes" / "operator"
CAMEL = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][A-Za-z0-9]*)+$")
# CamelCase strings in the operator that are not its reasons: kinds, Kubernetes' own enum values
# and reasons it reads (pods', Kueue's), condition types.
NOT_REASONS = {
    "BearerToken", "ClusterFirstWithHostNet", "ConfigMap", "ContainerCreating", "DisruptionTarget",
    "DoesNotExist", "ExactCount", "FailJob", "MembersReachable", "NoExecute", "NoReservation",
    "NoSchedule", "NodeAffinity", "NodeFailures", "NodeShutdown", "NotIn", "PodGroup",
    "PodScheduled", "PriorityClass", "QuotaReserved", "ResourceClaimTemplate", "RuntimeDefault",
    "ComputeDomain",  # NVIDIA DRA driver's kind (core/compute_domains.py)
    "SubjectAccessReview", "TokenRequest", "TokenReview", "WorkloadPriorityClass",
    "PodsReady", "WaitForStart", "WaitForRecovery",  # Kueue's PodsReady condition, written for it
    "BestEffort", "NotBestEffort", "NotTerminating",  # ResourceQuota scopes (core/quota.py)
    "HyperNode",  # Volcano's kind (core/island_topology.py)
    "TrainJob",  # Kubeflow Trainer's kind, a JobSet's owner (core/jobset_kueue.py)
}  # fmt: skip


def reasons_in_code() -> set[str]:
    found = set()
    for path in OPERATOR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and CAMEL.match(node.value):
                found.add(node.value)
    return found - NOT_REASONS


def test_the_scan_finds_the_reasons():
    """The scan itself: reasons set in different ways (stall(), a fail() tuple, a class
    attribute, kopf.event(reason=...)) are all found."""
    assert {"PolicyViolation", "BackoffLimitExceeded", "WaitingForCapacity", "MemberCleanupBlocked"} <= (
        reasons_in_code()
    )


def test_every_reason_has_a_section():
    sections = anchors(PAGE)
    missing = sorted(r for r in reasons_in_code() if r.lower() not in sections)
    assert not missing, f"docs/troubleshooting.md has no section for {missing}: say what to check and do"


def test_every_alert_links_to_its_section():
    rules = yaml.safe_load((REPO / "charts/holmes/files/monitoring/rules.yaml").read_text())
    sections = anchors(PAGE)
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert alerts
    for rule in alerts:
        url = rule["annotations"].get("runbook_url", "")
        assert url.startswith("__RUNBOOKS__#"), f"{rule['alert']}: no runbook_url"
        anchor = url.partition("#")[2]
        assert anchor == rule["alert"].lower() and anchor in sections, rule["alert"]
