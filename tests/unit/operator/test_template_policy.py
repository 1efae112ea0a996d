"""spec.template checked before rendering: wrongly typed fields and the admin's job policy."""

from __future__ import annotations

import pytest

from holmes.contract.podtemplate import shape_problems
from holmes.operator.core.render import RenderSettings
from holmes.operator.core.template import TemplatePolicy, policy_violations
from tests.helpers.operator.opfixtures import FakeWorld, manifest
from tests.helpers.operator.render_helpers import pod_for


def spec_of(**spec) -> dict:
    return {"spec": spec}


def container(**c) -> dict:
    return {"spec": {"containers": [{"name": "trainer", **c}]}}


@pytest.mark.parametrize(
    "template, path",
    [
        (spec_of(affinity="x"), "spec.template.spec.affinity: must be a mapping, got the string 'x'"),
        (spec_of(securityContext="x"), "spec.template.spec.securityContext: must be a mapping"),
        (
            container(ports=[80]),
            "spec.template.spec.containers[0].ports[0]: must be a mapping, got the number 80",
        ),
        (container(env=[{"name": 5}]), "spec.template.spec.containers[0].env[0].name: must be a string"),
        (container(command="python train.py"), "spec.template.spec.containers[0].command: must be a list of"),
        (container(resources={"limits": [1]}), "spec.template.spec.containers[0].resources.limits: must be"),
        (spec_of(volumes=[{"emptyDir": {}}]), "spec.template.spec.volumes[0].name: must be a string"),
        ({"metadata": {"labels": {"team": 7}}}, "spec.template.metadata.labels.team: must be a string"),
        (spec_of(containers={"name": "x"}), "spec.template.spec.containers: must be a list, got a mapping"),
        ({"spec": "x"}, "spec.template.spec: must be a mapping"),
    ],
)
def test_wrongly_typed_fields_are_named_with_their_path(template, path):
    problems = shape_problems(template)
    assert any(p.startswith(path) for p in problems), problems


def test_a_well_formed_template_has_no_problem():
    t = {
        "metadata": {"labels": {"team": "a"}},
        "spec": {
            "affinity": {},
            "tolerations": [{"key": "gpu", "operator": "Exists"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
            "containers": [
                {
                    "name": "trainer",
                    "image": "i",
                    "command": ["python"],
                    "env": [{"name": "A", "value": "1"}],
                    "resources": {"limits": {"memory": "1Gi"}},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    "ports": [{"containerPort": 80}],
                }
            ],
        },
    }
    assert shape_problems(t) == [] and policy_violations(t, TemplatePolicy()) == []


TOKEN = {"serviceAccountToken": {"path": "token", "audience": "x"}}

# Holmes' own controls, which Pod Security Admission does not see: (template, path, flag, allowing)
CASES = [
    (
        spec_of(serviceAccountName="admin"),
        "spec.serviceAccountName",
        "allow-service-accounts admin",
        TemplatePolicy(service_accounts=("admin",)),
    ),
    (
        spec_of(automountServiceAccountToken=True),
        "spec.automountServiceAccountToken",
        "allow-service-accounts default",
        TemplatePolicy(service_accounts=("default",)),
    ),
    (
        spec_of(volumes=[{"name": "t", "projected": {"sources": [{"configMap": {"name": "ca"}}, TOKEN]}}]),
        "spec.volumes[0].projected.sources[1].serviceAccountToken",
        "allow-service-accounts default",
        TemplatePolicy(service_accounts=("default",)),
    ),
    (spec_of(nodeName="n1"), "spec.nodeName", "allow-node-name", TemplatePolicy(allow_node_name=True)),
    (
        spec_of(runtimeClassName="kata"),
        "spec.runtimeClassName",
        "allow-runtime-classes kata",
        TemplatePolicy(runtime_classes=("kata",)),
    ),
]


@pytest.mark.parametrize("template, path, flag, allowing", CASES)
def test_each_policy_field_is_denied_by_default_and_allowed_by_its_setting(template, path, flag, allowing):
    (v,) = policy_violations(template, TemplatePolicy())
    assert v.startswith(f"spec.template.{path}: ") and f"--{flag}" in v and "jobPolicy." in v
    assert policy_violations(template, allowing) == []


@pytest.mark.parametrize(
    "template",
    [
        spec_of(hostNetwork=True),
        spec_of(volumes=[{"name": "h", "hostPath": {"path": "/"}}]),
        container(securityContext={"privileged": True, "capabilities": {"add": ["SYS_ADMIN", "IPC_LOCK"]}}),
        spec_of(securityContext={"seccompProfile": {"type": "Unconfined"}}),
    ],
)
def test_pod_security_is_left_to_pod_security_admission(template):
    """Issue 50, item 7: the Pod Security Standards are checked by the API server (Pod Security
    Admission, on the dry run before the gang and on every pod), not by a copy in Holmes
    (tests/e2e/operator/test_pod_security_cluster.py proves it on the real API server)."""
    assert policy_violations(template, TemplatePolicy()) == []


def test_the_reconciler_stalls_on_either_with_the_path():
    w = FakeWorld(manifest(template=container(ports=[80])))
    w.step()
    stalled = w.condition("Stalled")
    assert stalled["reason"] == "InvalidSpec" and "containers[0].ports[0]" in stalled["message"]
    assert w.pods == {}
    w = FakeWorld(manifest(template=spec_of(nodeName="n1")))
    w.step()
    stalled = w.condition("Stalled")
    assert stalled["reason"] == "PolicyViolation" and "spec.template.spec.nodeName" in stalled["message"]
    assert w.pods == {}
    w.settings = RenderSettings(policy=TemplatePolicy(allow_node_name=True))
    w.step()
    assert len(w.pods) == 4 and w.condition("Stalled")["status"] == "False"


def test_trainer_pods_get_secure_defaults():
    pod, _, _ = pod_for(0)
    spec, c = pod["spec"], pod["spec"]["containers"][0]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
