"""The job policy against the Pod Security Standards, control by control
(tests/helpers/operator/pss_cases.py), and every kind of pod Holmes renders against the level it
enforces."""

from __future__ import annotations

import pytest

from holmes.operator.core.render import JobRef, RenderSettings, build_pod
from holmes.operator.core.template import (
    BASELINE,
    LEVELS,
    POLICY_OPTIONS,
    RESTRICTED,
    TemplatePolicy,
    policy_violations,
    rendered_pod_violations,
)
from tests.helpers.operator.opfixtures import FakeWorld, manifest
from tests.helpers.operator.pss_cases import CASES, PSA_CHECKS, Case
from tests.helpers.operator.render_helpers import planned, route_for

IDS = [case.id for case in CASES]


def test_every_pod_security_admission_check_has_a_case():
    covered = {case.control for case in CASES}
    missing = (PSA_CHECKS[BASELINE] | PSA_CHECKS[RESTRICTED]) - covered
    assert not missing


def test_every_exception_lets_some_failing_case_through():
    defaults = TemplatePolicy()
    used = {
        o.field
        for case in CASES
        for o in POLICY_OPTIONS
        if getattr(case.allowing, o.field) != getattr(defaults, o.field)
    }
    used |= {"level"} if any(c.flag.startswith("policy-level") for c in CASES) else set()
    assert used == {o.field for o in POLICY_OPTIONS}


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_failing_case_is_refused_naming_the_field_and_the_flag(case: Case):
    (v,) = policy_violations(case.fail, TemplatePolicy(level=case.level))
    assert v.startswith(f"spec.template.{case.path}: ")
    assert f"allowed by the operator flag --{case.flag}, chart value jobPolicy." in v


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_passing_case_is_accepted(case: Case):
    assert policy_violations(case.ok, TemplatePolicy(level=case.level)) == []


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_exception_lets_the_failing_case_through(case: Case):
    assert policy_violations(case.fail, case.allowing) == []


@pytest.mark.parametrize("case", [c for c in CASES if c.level == BASELINE], ids=lambda c: c.id)
def test_restricted_refuses_what_baseline_refuses(case: Case):
    refused = policy_violations(case.fail, TemplatePolicy(level=RESTRICTED))
    assert any(v.startswith(f"spec.template.{case.path}: ") for v in refused), refused


def test_the_default_level_is_baseline_and_a_wrong_level_is_refused():
    assert TemplatePolicy().level == BASELINE
    with pytest.raises(ValueError, match="level 'strict': expected one of baseline, restricted"):
        TemplatePolicy(level="strict")


# ---- what Holmes renders -------------------------------------------------------------------------

REF = JobRef("tiny", "ns", 1, "spechash", "modelhash")
VOLCANO = {
    "metadata": {"annotations": {"scheduling.volcano.sh/queue-name": "q"}},
    "spec": {"schedulerName": "volcano"},
}
SIDECARS = {  # containers Holmes does not run, with nothing set: Holmes hardens them at restricted
    "spec": {
        "initContainers": [{"name": "fetch", "image": "busybox"}],
        "containers": [{"name": "trainer"}, {"name": "sidecar", "image": "busybox"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
    }
}


def holmes_pods(
    level: str, template: dict | None = None, network: str = "podNetwork", **build
) -> list[tuple[str, dict]]:
    """One pod per node of a plan over every NIC kind (InfiniBand, RoCE, Ethernet; rank 0 serves
    metrics), rendered at ``level`` from ``template``: (a name for the kind, the pod)."""
    nodes, layout, _ = planned()
    settings = RenderSettings(policy=TemplatePolicy(level=level))
    out = []
    for rank in range(len(layout.nodes)):
        route = route_for(layout, rank, nodes, network=network)
        pod = build_pod(
            REF,
            layout,
            rank,
            route=route,
            template=template,
            settings=settings,
            **build,
        )
        out.append((f"rank {rank} ({route.nic})", pod))
    return out


# Every kind of pod Holmes renders: (kind, template, build_pod keywords). A new kind (say, an
# external framework's launcher) adds a row, or calls rendered_pod_violations on its own pods.
POD_KINDS = [
    ("trainer pods, no template", None, {}),
    ("trainer pods across member clusters", None, {"master": "10.0.0.1"}),
    ("trainer pods of a Volcano gang", VOLCANO, {}),
    ("trainer pods with the user's init and sidecar containers", SIDECARS, {}),
]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("kind, template, build", POD_KINDS, ids=[k[0] for k in POD_KINDS])
def test_every_pod_holmes_renders_passes_the_level_it_enforces(level, kind, template, build):
    pods = holmes_pods(level, template, **build)
    assert {
        pod["spec"]["containers"][0]["securityContext"].get("capabilities", {}).get("add") is not None
        for _, pod in pods
    } == {
        True,
        False,
    }, "the plan covers RDMA (IPC_LOCK) and Ethernet nodes"
    for name, pod in pods:
        assert rendered_pod_violations(pod, level) == [], name


def test_a_restricted_namespace_needs_the_restricted_level():
    """Rendered at baseline, Holmes' pods do not say runAsNonRoot: Pod Security Admission at
    restricted would refuse them (docs/install.md#pod-security-admission)."""
    for name, pod in holmes_pods(BASELINE):
        refused = rendered_pod_violations(pod, RESTRICTED)
        assert "spec.containers[0].securityContext.runAsNonRoot" in {v.split(":")[0] for v in refused}, name


@pytest.mark.parametrize("level", LEVELS)
def test_host_network_pods_need_only_the_host_namespaces_exception(level):
    for name, pod in holmes_pods(level, network="hostNetwork"):
        (v,) = rendered_pod_violations(pod, level)
        assert v.startswith("spec.hostNetwork: ") and "--allow-host-namespaces" in v, name


def test_the_rendered_check_is_not_vacuous():
    """Without Holmes' defaults a plain pod fails restricted (and IPC_LOCK passes only as Holmes'
    own exception, never through the template check)."""
    _, pod = holmes_pods(RESTRICTED)[0]
    c = pod["spec"]["containers"][0]
    del c["securityContext"]["allowPrivilegeEscalation"]
    del pod["spec"]["securityContext"]["runAsNonRoot"]
    del pod["spec"]["securityContext"]["seccompProfile"]
    pod["spec"]["automountServiceAccountToken"] = True
    refused = {v.split(":")[0] for v in rendered_pod_violations(pod, RESTRICTED)}
    assert refused == {
        "spec.containers[0].securityContext.allowPrivilegeEscalation",
        "spec.containers[0].securityContext.runAsNonRoot",
        "spec.containers[0].securityContext.seccompProfile",
        "spec.automountServiceAccountToken",
    }


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_template_check_and_the_rendered_pod_agree(case: Case):
    """A template the policy accepts renders pods that pass the level; one it refuses renders
    pods refused at the same field (IPC_LOCK aside: on RDMA nodes Holmes grants it itself)."""
    for name, pod in holmes_pods(case.level, case.ok):
        assert rendered_pod_violations(pod, case.level) == [], name
    if "IPC_LOCK" in case.flag:
        return
    for name, pod in holmes_pods(case.level, case.fail):
        refused = rendered_pod_violations(pod, case.level)
        assert any(v.startswith(f"{case.path}: ") for v in refused), (name, refused)


@pytest.mark.parametrize("level", LEVELS)
def test_the_pods_the_reconciler_creates_pass_the_level(level):
    w = FakeWorld(manifest(template=SIDECARS))
    w.settings = RenderSettings(policy=TemplatePolicy(level=level))
    w.step()
    assert len(w.pods) == 4
    for pod in w.pods.values():
        assert rendered_pod_violations(pod, level) == []
