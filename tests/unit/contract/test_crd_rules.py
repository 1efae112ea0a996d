"""The CRD's CEL rules (x-kubernetes-validations): valid for the published apiextensions.k8s.io/v1
schema, compiled and run by cel-python on valid and invalid HolmesJobs, never stricter than the
contract's reader (a spec the operator runs is admitted), and rendered by the chart only for
servers that run them (Kubernetes >= 1.25). The 1.20 test bed's behaviour with the field is
checked on the real server in tests/packaging/test_crd_rules_cluster.py."""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import celpy
import pytest
import yaml
from crdgen.render import crd, openapi_schema

from holmes.contract import SpecError, load_job
from tests.helpers.contract.cel_admission import RULES, admit, program
from tests.helpers.contract.spec_helpers import minimal_spec, problems_of
from tests.helpers.contract.spec_mutations import SEEDS, mutate, seeds
from tests.helpers.openapi_check import check
from tests.helpers.packaging.packaging_helpers import CHART, CRDS, helm, without_rules

SCHEMAS = json.loads((Path(__file__).parent / "data" / "k8s-1.34-crd-schemas.json").read_text())
PROPS = {"$ref": "#/$defs/io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSONSchemaProps"}
SCHEMA = openapi_schema()


def nodes(node: dict, path: str = "openAPIV3Schema"):
    """Every JSONSchemaProps node of a schema, with its path."""
    yield path, node
    for key, sub in (node.get("properties") or {}).items():
        yield from nodes(sub, f"{path}.properties.{key}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from nodes(node[key], f"{path}.{key}")


def schema_errors(doc: dict) -> list[str]:
    (version,) = doc["spec"]["versions"]
    errors = check(doc, SCHEMAS["CustomResourceDefinition"], SCHEMAS["$defs"])
    for path, node in nodes(version["schema"]["openAPIV3Schema"]):
        errors += check(node, PROPS, SCHEMAS["$defs"], path)
        rules = [r.get("rule") for r in node.get(RULES, ())]
        if len(set(rules)) != len(rules):  # a list-map keyed by rule
            errors.append(f"{path}: a rule appears twice")
        errors += [
            f"{path}: a message with a line break"
            for r in node.get(RULES, ())
            if "\n" in r.get("message", "")
        ]
    return errors


def all_rules() -> list[tuple[str, dict]]:
    return [(p, r) for p, node in nodes(SCHEMA) for r in node.get(RULES, ())]


def job(spec: dict) -> dict:
    return {"apiVersion": "holmes.dev/v1alpha1", "kind": "HolmesJob", "metadata": {"name": "j"}, "spec": spec}


# ---- the published schema ---------------------------------------------------------------------


def test_the_crd_with_its_rules_matches_the_published_apiextensions_v1_schema():
    assert len(all_rules()) >= 15
    assert schema_errors(crd()) == []


def test_the_schema_check_refuses_a_misspelt_rule_field():
    doc = crd()
    spec = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec[RULES][0]["messsage"] = spec[RULES][0].pop("message")
    spec[RULES].append({"message": "no rule"})
    errors = schema_errors(doc)
    assert any("unknown field messsage" in e for e in errors)
    assert any("rule is required" in e for e in errors)


# ---- compiled and run by cel-python ---------------------------------------------------------------


@pytest.mark.parametrize("path,rule", all_rules(), ids=lambda x: x if isinstance(x, str) else x["rule"][:40])
def test_every_rule_compiles(path, rule):
    program(rule["rule"])


def test_a_rule_that_does_not_parse_is_caught():
    with pytest.raises(celpy.CELParseError):
        program("self.a %% 2 == 0")


@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: p.name)
def test_every_example_is_admitted(seed):
    assert admit(SCHEMA, yaml.safe_load(seed.read_text())) == []


def moe(**moe):
    return {"model": {**minimal_spec()["model"], "moe": {"experts": 8, **moe}}, "framework": "megatron"}


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
def test_the_rules_refuse_what_the_reader_refuses(sections, where, field):
    spec = minimal_spec(**sections)
    failures = admit(SCHEMA, job(spec))
    assert failures and all(f.startswith(f"{where}: ") for f in failures), failures
    assert any(field in p for p in problems_of(spec)), problems_of(spec)


def test_the_model_is_immutable_and_the_rest_may_change():
    old = job(minimal_spec())
    edited = copy.deepcopy(old)
    edited["spec"]["model"]["layers"] = 4
    assert admit(SCHEMA, edited, old) == [
        "spec.model: model is immutable (a job's checkpoints hold this model): create a new HolmesJob"
    ]
    assert admit(SCHEMA, edited) == []  # on create there is no old model
    edited["spec"]["model"]["layers"] = 8
    edited["spec"]["training"]["iterations"] = 20
    edited["spec"]["nodes"]["count"] = 4
    assert admit(SCHEMA, edited, old) == []
    # the server's default for architecture is what an old object holds: writing it is no edit
    edited["spec"]["model"]["architecture"] = "gpt"
    assert admit(SCHEMA, edited, old) == []


def test_the_rules_never_refuse_a_spec_the_reader_accepts():
    """Seeded mutations of the examples (tests/contract/test_spec_fuzz): each one the contract
    accepts (the operator would run it) passes every rule."""
    rng = random.Random(35)
    examples = seeds()
    accepted = 0
    for _ in range(2000):
        doc = mutate(rng.choice(examples), rng)
        try:
            load_job(doc)
        except SpecError:
            continue
        accepted += 1
        assert admit(SCHEMA, doc) == [], yaml.safe_dump(doc["spec"])
    assert accepted > 100


# ---- the chart renders them for servers that run them -----------------------------------------


@pytest.mark.parametrize(
    "kube,rules", [("1.20.2", False), ("1.24.17", False), ("1.25.0", True), ("1.30.1", True)]
)
def test_the_chart_renders_the_rules_for_kubernetes_1_25_and_later(kube, rules):
    src = yaml.safe_load((CRDS / "holmesjob.yaml").read_text())
    out = helm("template", "h", str(CHART), "--kube-version", kube, "--show-only", "templates/crds.yaml")
    rendered = yaml.safe_load(out.stdout)
    assert rendered["spec"] == (src["spec"] if rules else without_rules(src["spec"]))
    assert (RULES in out.stdout) == rules


def test_the_chart_leaves_the_rules_out_when_told():
    out = helm(
        "template",
        "h",
        str(CHART),
        "--set",
        "crds.validationRules=false",
        "--show-only",
        "templates/crds.yaml",
    ).stdout
    assert RULES not in out and "openAPIV3Schema" in out


def test_an_explicit_null_is_dropped_and_defaulted_before_the_rules_run():
    # the API server prunes a null of a field that is not nullable, then defaults it: the rule on
    # parallelism.tensor sees 1, not null (found by the seeded mutations above)
    assert admit(SCHEMA, job(minimal_spec(parallelism={"tensor": None}))) == []
