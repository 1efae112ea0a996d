"""What the 1.20 test bed does with the CRD's CEL rules (x-kubernetes-validations, Kubernetes
1.25+): kubectl's OpenAPI check refuses the unknown field, the server itself drops it, and the
chart rendered for this server leaves the rules out (so `helm install` works here). The rules
themselves are checked with cel-python in tests/contract/test_crd_rules.py."""

from __future__ import annotations

import json

import yaml

from tests.helpers.packaging.packaging_helpers import CHART, CRDS, helm, without_rules

RULES = "x-kubernetes-validations"


def test_kubectl_1_20_refuses_the_rules_and_the_server_drops_them(cluster):
    crd = str(CRDS / "holmesjob.yaml")
    assert RULES in (CRDS / "holmesjob.yaml").read_text()
    refused = cluster.kubectl("apply", "--dry-run=server", "-f", crd, check=False)
    assert refused.returncode != 0 and f'unknown field "{RULES}"' in refused.stderr, refused.stderr
    out = cluster.kubectl("apply", "--dry-run=server", "--validate=false", "-f", crd, "-o", "json").stdout
    stored = json.loads(out)["spec"]["versions"][0]["schema"]
    src = yaml.safe_load((CRDS / "holmesjob.yaml").read_text())["spec"]["versions"][0]["schema"]
    assert RULES not in json.dumps(stored)
    assert stored == without_rules(src)  # all else kept


def test_the_chart_rendered_for_this_server_is_accepted_as_it_is(cluster):
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    out = helm("template", "h", str(CHART), "--kube-version", version, "--show-only", "templates/crds.yaml")
    assert RULES not in out.stdout
    cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=out.stdout)  # kubectl's check included
