"""The CRD's CEL rules (x-kubernetes-validations) run by the real API server: the CRD applies as
it is (the server compiles every rule, refusing one that does not), each example is admitted,
every spec the contract's reader refuses for a rule's reason is refused at apply time with the
rule's path, the model is immutable on update, and no spec the reader accepts is refused (seeded
mutations of the examples, each sent as a server-side dry run). The chart rendered for this server
carries the rules. The schema itself is checked in tests/unit/contract/test_crd_rules.py."""

from __future__ import annotations

import copy
import json
import random

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from holmes.contract import JobSpec, SpecError, load_job
from localkube.operatorproc import install_crd
from tests.helpers.contract.spec_helpers import minimal_spec, problems_of
from tests.helpers.contract.spec_mutations import SEEDS, mutate, seeds
from tests.helpers.packaging.packaging_helpers import CHART, CRDS, helm

pytestmark = pytest.mark.compat

RULES = "x-kubernetes-validations"
WHERE = ("holmes.dev", "v1alpha1")


@pytest.fixture(scope="module")
def jobs(cluster):
    install_crd(cluster.kubeconfig)
    return client.CustomObjectsApi(cluster.api_client())


def job(spec: dict, name: str = "j") -> dict:
    return {
        "apiVersion": "holmes.dev/v1alpha1",
        "kind": "HolmesJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def refusal(jobs, namespace: str, obj: dict) -> list[str]:
    """The server's causes for refusing to create ``obj`` (a dry run): empty when admitted."""
    try:
        jobs.create_namespaced_custom_object(*WHERE, namespace, "holmesjobs", obj, dry_run="All")
    except ApiException as e:
        if e.status != 422:
            raise
        details = json.loads(e.body).get("details") or {}
        return [f"{c.get('field')}: {c.get('message')}" for c in details.get("causes") or []] or [e.body]
    return []


def test_the_crd_applies_with_its_rules_and_the_server_keeps_them(cluster, jobs):
    live = cluster.get_json("crd", "holmesjobs.holmes.dev")["spec"]["versions"]
    src = yaml.safe_load((CRDS / "holmesjob.yaml").read_text())["spec"]["versions"]
    assert rule_count(src[0]["schema"]) >= 15
    assert [(v["name"], v["schema"]) for v in live] == [(v["name"], v["schema"]) for v in src]


def rule_count(node) -> int:
    if isinstance(node, dict):
        return len(node.get(RULES, ())) + sum(rule_count(v) for k, v in node.items() if k != RULES)
    if isinstance(node, list):
        return sum(rule_count(v) for v in node)
    return 0


def test_a_rule_that_does_not_compile_is_refused_with_the_crd(cluster):
    doc = yaml.safe_load((CRDS / "holmesjob.yaml").read_text())
    doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][RULES].append(
        {"rule": "self.a %% 2 == 0", "message": "broken"}
    )
    r = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert r.returncode != 0 and "compilation failed" in r.stderr, r.stderr


@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_every_example_is_admitted(jobs, namespace, seed):
    doc = yaml.safe_load(seed.read_text())
    doc["metadata"] = {"name": "example"}
    assert refusal(jobs, namespace, doc) == []


def moe(**fields):
    return {"model": {**minimal_spec()["model"], "moe": {"experts": 8, **fields}}, "framework": "megatron"}


def model(**fields):
    return {"model": {**minimal_spec()["model"], **fields}}


def training(**fields):
    return {"training": {**minimal_spec()["training"], **fields}}


# (sections replaced in minimal_spec, the path the API server names, the field the reader names)
REFUSED = [
    (model(hiddenSize=250), "spec.model", "hiddenSize"),
    (model(architecture="llama", kvHeads=3), "spec.model", "kvHeads"),
    (model(kvHeads=4), "spec.model", "kvHeads"),  # gpt has no grouped-query attention
    (model(ropeTheta=500000.0), "spec.model", "ropeTheta"),
    (model(init={"huggingface": {"path": "/w"}}), "spec.model", "init"),
    (model(architecture="llama", hiddenSize=24), "spec.model", "head size"),
    (moe(expertsPerToken=9), "spec.model.moe", "expertsPerToken"),
    (training(globalBatchSize=15), "spec.training", "globalBatchSize"),
    (training(warmupIterations=11), "spec.training", "warmupIterations"),
    (training(minLearningRate=0.1), "spec.training", "minLearningRate"),
    (training(acrossIslands={"innerSteps": 10, "fragments": 3}), "spec.training.acrossIslands", "fragments"),
    (
        training(acrossIslands={"innerSteps": 10, "fragments": 2, "overlapSteps": 6}),
        "spec.training.acrossIslands",
        "overlapSteps",
    ),
    (
        training(acrossIslands={"fragments": 5, "overlapSteps": 11}),
        "spec.training.acrossIslands",
        "overlapSteps",
    ),
    ({"nodes": {"count": 2, "gpusPerNode": 4, "minCount": 3}}, "spec.nodes", "minCount"),
    ({"parallelism": {"tensor": 3}}, "spec", "gpusPerNode"),
    ({"parallelism": {"tensor": 2}, **model(vocabSize=1001)}, "spec", "vocabSize"),
    ({"parallelism": {"pipeline": 9}}, "spec", "pipeline"),
    ({"parallelism": {"data": 3}}, "spec", "globalBatchSize"),
    ({"parallelism": {"expert": 3}, **moe()}, "spec", "expert"),
    ({"parallelism": {"tensor": 0}}, "spec.parallelism.tensor", "tensor"),
    ({"parallelism": {"pipeline": "most"}}, "spec.parallelism.pipeline", "pipeline"),
]


@pytest.mark.parametrize("sections,where,field", REFUSED, ids=lambda x: x if isinstance(x, str) else None)
def test_the_rules_refuse_what_the_reader_refuses(jobs, namespace, sections, where, field):
    spec = minimal_spec(**sections)
    causes = refusal(jobs, namespace, job(spec))
    assert causes and all(c.startswith(f"{where}: ") for c in causes), causes
    assert any(field in p for p in problems_of(spec)), problems_of(spec)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("x" * 51, "metadata.name: at most 50 characters"),
        ("a.b", "metadata.name must be a DNS-1035 label"),
        ("9lives", "metadata.name must be a DNS-1035 label"),
    ],
)
def test_a_name_its_pods_cannot_carry_is_refused_at_admission(jobs, namespace, name, words):
    """Not a Stalled job: the API server refuses the name (the pod hostname <name>-<attempt>-<rank>
    is a 63-character DNS-1035 label), in either served version."""
    for version in ("v1alpha1", "v1beta1"):
        with pytest.raises(ApiException) as e:
            jobs.create_namespaced_custom_object(
                "holmes.dev",
                version,
                namespace,
                "holmesjobs",
                {**job(minimal_spec(), name), "apiVersion": f"holmes.dev/{version}"},
                dry_run="All",
            )
        assert e.value.status == 422 and words in e.value.body, e.value.body
    assert refusal(jobs, namespace, job(minimal_spec(), "x" * 50)) == []


def test_an_object_written_in_either_version_is_served_in_both(jobs, namespace):
    """v1beta1 beside the storage version v1alpha1, conversion None: the operator, which lists and
    watches v1alpha1, sees a job created as v1beta1 (and a v1beta1 client the operator's)."""
    beta = {**job(minimal_spec(), "beta"), "apiVersion": "holmes.dev/v1beta1"}
    jobs.create_namespaced_custom_object("holmes.dev", "v1beta1", namespace, "holmesjobs", beta)
    jobs.create_namespaced_custom_object(*WHERE, namespace, "holmesjobs", job(minimal_spec(), "alpha"))
    specs = {}
    for version in ("v1alpha1", "v1beta1"):
        listed = jobs.list_namespaced_custom_object("holmes.dev", version, namespace, "holmesjobs")["items"]
        assert {(j["apiVersion"], j["metadata"]["name"]) for j in listed} == {
            (f"holmes.dev/{version}", "alpha"),
            (f"holmes.dev/{version}", "beta"),
        }
        for name in ("alpha", "beta"):
            got = jobs.get_namespaced_custom_object("holmes.dev", version, namespace, "holmesjobs", name)
            assert got["apiVersion"] == f"holmes.dev/{version}"
            specs[version, name] = got["spec"]
    assert specs["v1alpha1", "beta"] == specs["v1beta1", "beta"] == specs["v1beta1", "alpha"]
    # the status subresource in the other version: what the operator writes, a v1beta1 reader reads
    jobs.patch_namespaced_custom_object_status(
        *WHERE, namespace, "holmesjobs", "beta", {"status": {"phase": "Pending"}}
    )
    got = jobs.get_namespaced_custom_object("holmes.dev", "v1beta1", namespace, "holmesjobs", "beta")
    assert got["status"]["phase"] == "Pending"


def test_the_model_is_immutable_and_the_rest_may_change(jobs, namespace):
    made = jobs.create_namespaced_custom_object(*WHERE, namespace, "holmesjobs", job(minimal_spec(), "imm"))
    edited = copy.deepcopy(made)
    edited["spec"]["model"]["layers"] = 4
    with pytest.raises(ApiException) as e:
        jobs.replace_namespaced_custom_object(*WHERE, namespace, "holmesjobs", "imm", edited)
    assert e.value.status == 422
    assert "model is immutable (a job's checkpoints hold this model): create a new HolmesJob" in e.value.body
    edited["spec"]["model"]["layers"] = made["spec"]["model"]["layers"]
    edited["spec"]["training"]["iterations"] = 20
    edited["spec"]["nodes"]["count"] = 4
    # the server's default for architecture is what the stored object holds: writing it is no edit
    edited["spec"]["model"]["architecture"] = "gpt"
    jobs.replace_namespaced_custom_object(*WHERE, namespace, "holmesjobs", "imm", edited)


def test_an_explicit_null_is_dropped_and_defaulted_before_the_rules_run(jobs, namespace):
    # the API server prunes a null of a field that is not nullable, then defaults it: the rule on
    # parallelism.tensor sees 1, not null
    assert refusal(jobs, namespace, job(minimal_spec(parallelism={"tensor": None}))) == []


def test_a_tensor_group_over_whole_nodes_is_admitted_and_one_over_part_of_a_node_refused(jobs, namespace):
    """tensor 8 on 4-GPU nodes spans two nodes of an NVLink domain (GB200 NVL72): the server admits
    it (the planner checks the domain, which the server cannot see); tensor 6 is neither a divisor
    nor a multiple of 4 and is refused, by the rule and the reader alike."""
    assert refusal(jobs, namespace, job(minimal_spec(parallelism={"tensor": 8}))) == []
    JobSpec.from_spec(minimal_spec(parallelism={"tensor": 8}))
    spec = minimal_spec(parallelism={"tensor": 6}, model={**minimal_spec()["model"], "attentionHeads": 12})
    spec["model"]["hiddenSize"], spec["model"]["vocabSize"] = 384, 1020
    causes = refusal(jobs, namespace, job(spec))
    assert any("multiple of it" in c and "NVLink domain" in c for c in causes), causes
    assert any("multiple such as 8" in p for p in problems_of(spec)), problems_of(spec)


def test_the_rules_never_refuse_a_spec_the_reader_accepts(jobs, namespace):
    """Seeded mutations of the examples (tests/unit/contract/test_spec_fuzz): each one the contract
    accepts (the operator would run it) is admitted by the server."""
    rng = random.Random(35)
    examples = seeds()
    accepted = 0
    for _ in range(600):
        doc = mutate(rng.choice(examples), rng)
        try:
            load_job(doc)
        except SpecError:
            continue
        accepted += 1
        doc["metadata"] = {"name": "fuzz"}
        # the pod template is the pod's schema's business (the reader leaves it to the API server)
        causes = refusal(jobs, namespace, doc)
        own = [c for c in causes if not c.startswith("spec.template.")]
        if len(own) < len(causes):  # a schema error in the template stops the rules from running
            own = [c for c in own if "validation rules were not checked" not in c]
        assert own == [], (causes, yaml.safe_dump(doc["spec"]))
    assert accepted > 30


def test_the_chart_rendered_for_this_server_carries_the_rules_and_is_accepted(cluster):
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    out = helm("template", "h", str(CHART), "--kube-version", version, "--show-only", "templates/crds.yaml")
    assert RULES in out.stdout
    cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=out.stdout)  # kubectl's check included
