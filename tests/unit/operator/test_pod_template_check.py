"""Issue 50, items 5-7, the pure parts: a GPU limit that disagrees with gpusPerNode refused naming
the field; the dry run's samples and how its refusals reach the job (TemplateRejected, no pod);
the defaults Holmes fills in follow the Pod Security level the namespace enforces. The API server's
own checks (unknown fields, Pod Security) run for real in tests/e2e/operator/test_pod_security_cluster.py."""

from __future__ import annotations

import pytest

from holmes.operator.core import dry_run
from holmes.operator.core.state import ChildRefusal
from holmes.operator.core.template import ENFORCE_LABEL, enforced_level
from holmes.operator.preview import PreviewError, children
from tests.helpers.operator.opfixtures import FakeWorld, manifest


def gpu_template(**resources) -> dict:
    return {"spec": {"containers": [{"name": "trainer", "resources": resources}]}}


# ---- a GPU limit that disagrees with gpusPerNode -------------------------------------------------


@pytest.mark.parametrize("part", ["limits", "requests"])
def test_a_gpu_limit_other_than_gpus_per_node_stalls_the_job_naming_the_field(part):
    w = FakeWorld(manifest(gpus=8, template=gpu_template(**{part: {"nvidia.com/gpu": 4}})))
    w.step()
    stalled = w.condition("Stalled")
    assert stalled["reason"] == "InvalidSpec", stalled
    assert f"spec.template.spec.containers[0].resources.{part}[nvidia.com/gpu]: 4" in stalled["message"]
    assert "spec.nodes.gpusPerNode: 8" in stalled["message"] and w.pods == {}


def test_the_trainer_container_is_the_one_checked_and_an_equal_limit_runs():
    sidecar = {"name": "sidecar", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    trainer = {"name": "trainer", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    w = FakeWorld(manifest(template={"spec": {"containers": [sidecar, trainer]}}))
    w.step()
    assert w.condition("Stalled")["status"] == "False" and len(w.pods) == 4


def test_holmes_plan_pods_refuses_it_too():
    nodes = FakeWorld(manifest()).nodes
    with pytest.raises(PreviewError, match=r"resources\.limits\[nvidia\.com/gpu\]: 2 disagrees"):
        children(manifest(gpus=1, template=gpu_template(limits={"nvidia.com/gpu": 2})), nodes)


# ---- the dry run ----------------------------------------------------------------------------------


def test_one_pod_of_each_shape_is_dry_run():
    w = FakeWorld(manifest(count=4))
    d = w.step()
    pods = d.create_pods
    assert len(pods) == 4 and len({p["metadata"]["name"] for p in pods}) == 4
    kinds = {p["metadata"]["labels"]["holmes.dev/nic"] for p in pods}
    samples = dry_run.samples(pods)
    # ranks, nodes and ports differ (rank 0 serves metrics); what the API server checks differs
    # with the route: one pod per NIC kind here (two Ethernet pods, one sample)
    assert len(kinds) == 3 and len(samples) == 3
    assert {p["metadata"]["labels"]["holmes.dev/nic"] for p in samples} == kinds


@pytest.mark.parametrize(
    "code, reason, message, about",
    [
        (400, "BadRequest", 'strict decoding error: unknown field "spec.nodeSelectr"', True),
        (422, "Invalid", 'Pod "x" is invalid: spec.containers[0].image: Required value', True),
        (403, "Forbidden", 'pods "x" is forbidden: violates PodSecurity "baseline:latest": privileged', True),
        (403, "Forbidden", 'pods "x" is forbidden: exceeded quota: gpus', False),
        (400, "BadRequest", 'admission webhook "v.example.com" does not support dry run', False),
        (429, "TooManyRequests", "slow down", False),
        (500, "InternalError", "etcd", False),
    ],
)
def test_only_refusals_the_template_can_fix_stop_the_job(code, reason, message, about):
    assert dry_run.about_template(ChildRefusal("Pod", "x", code, reason, message)) is about


def test_the_refusal_names_the_jobs_field():
    no = ChildRefusal(
        "Pod",
        "tiny-1-0",
        400,
        "BadRequest",
        'strict decoding error: unknown field "spec.nodeSelectr", unknown field '
        '"spec.containers[0].volumeMount", unknown field "metadata.labelz"',
        dry_run=True,
    )
    text = dry_run.message(no)
    assert '"spec.template.spec.nodeSelectr"' in text
    assert '"spec.template.spec.containers[0].volumeMount"' in text
    assert '"spec.template.metadata.labelz"' in text and "tiny-1-0 (400 BadRequest)" in text


def test_a_dry_run_refusal_stalls_the_job_as_template_rejected_with_no_pod():
    w = FakeWorld(manifest())
    msg = 'strict decoding error: unknown field "spec.nodeSelectr"'
    w.refuse = lambda pod: ChildRefusal("Pod", pod["metadata"]["name"], 400, "BadRequest", msg, dry_run=True)
    w.step()
    stalled = w.condition("Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "TemplateRejected", stalled
    assert '"spec.template.spec.nodeSelectr"' in stalled["message"] and "no pod" in stalled["message"]
    assert w.pods == {}
    for _ in range(3):  # no retry loop while nothing changed
        w.step(seconds=10)
    assert w.reasons().count("TemplateRejected") == 1 and w.pods == {}
    w.refuse = None
    w.edit_spec(template={"metadata": {"labels": {"fixed": "yes"}}})
    w.step()
    assert len(w.pods) == 4 and w.condition("Stalled")["status"] == "False"


# ---- the namespace's level picks Holmes' defaults -------------------------------------------------


def test_the_enforced_level_is_read_from_the_namespace_label():
    assert enforced_level(None) == enforced_level({}) == "privileged"
    assert enforced_level({ENFORCE_LABEL: "restricted"}) == "restricted"
    assert enforced_level({ENFORCE_LABEL: "bogus"}) == "privileged"


@pytest.mark.parametrize("level, non_root", [("baseline", None), ("restricted", True), (None, None)])
def test_pods_in_a_restricted_namespace_get_the_restricted_defaults(level, non_root):
    sidecar = {"name": "sidecar", "image": "busybox"}
    w = FakeWorld(manifest(template={"spec": {"containers": [{"name": "trainer"}, sidecar]}}))
    w.namespace_labels = {ENFORCE_LABEL: level} if level else None
    w.step()
    for pod in w.pods.values():
        assert pod["spec"]["securityContext"].get("runAsNonRoot") is non_root
        side = pod["spec"]["containers"][1].get("securityContext") or {}
        assert (side.get("allowPrivilegeEscalation") is False) == (level == "restricted")


@pytest.mark.parametrize(
    "security, escalation",
    [
        ({}, False),
        ({"privileged": True}, None),
        ({"capabilities": {"add": ["SYS_ADMIN"]}}, None),
        ({"capabilities": {"add": ["CAP_SYS_ADMIN"]}}, None),
        ({"capabilities": {"add": ["NET_ADMIN"]}}, False),
    ],
)
def test_holmes_never_sets_no_escalation_where_the_api_server_refuses_it(security, escalation):
    """Found on the real API server: a privileged container (or one adding SYS_ADMIN) with
    Holmes' allowPrivilegeEscalation: false is an invalid Pod, whatever the namespace's level."""
    from holmes.operator.core.template import harden_container

    sc = harden_container({"name": "trainer", "securityContext": security})["securityContext"]
    assert sc.get("allowPrivilegeEscalation") is escalation
