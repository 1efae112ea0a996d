"""The CRD's CEL rules (x-kubernetes-validations): valid for the published apiextensions.k8s.io/v1
schema, and rendered by the chart unless told not to. The rules themselves run on the real API
server (tests/e2e/packaging/test_crd_rules_cluster.py): each example admitted, each spec the
reader refuses refused there, no spec the reader accepts refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from crdgen.render import crd, openapi_schema

from tests.helpers.openapi_check import check
from tests.helpers.packaging.packaging_helpers import CHART, CRDS, helm

RULES = "x-kubernetes-validations"
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
    errors = check(doc, SCHEMAS["CustomResourceDefinition"], SCHEMAS["$defs"])
    for path, node in (n for v in doc["spec"]["versions"] for n in nodes(v["schema"]["openAPIV3Schema"])):
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


# ---- the chart renders them -----------------------------------------


@pytest.mark.parametrize("kube", ["1.34.0", "1.37.2"])
def test_the_chart_renders_the_rules_as_they_are_for_every_supported_release(kube):
    src = yaml.safe_load((CRDS / "holmesjob.yaml").read_text())
    out = helm("template", "h", str(CHART), "--kube-version", kube, "--show-only", "templates/crds.yaml")
    assert yaml.safe_load(out.stdout)["spec"] == src["spec"]


def test_the_chart_refuses_a_release_older_than_it_supports():
    out = helm("template", "h", str(CHART), "--kube-version", "1.33.5", check=False)
    assert out.returncode != 0 and "kubeVersion" in out.stderr, out.stderr


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
