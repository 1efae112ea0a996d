"""The DRA route (core/routes.py): pods on nodes whose GPUs and NICs are DRA devices ask for them
through a ResourceClaimTemplate, a NIC beside each GPU where the PCIe roots allow; rendered by
the reconciler and `holmes plan --pods`, and checked against the Kubernetes 1.34 API's schemas."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from holmes.cli import main
from holmes.contract import load_job
from holmes.contract.network import IslandNetwork, Sriov
from holmes.operator import placement_facts
from holmes.operator.core import capacity
from holmes.operator.core.capacity import WaitingForCapacity, Workloads
from holmes.operator.core.placement import Placement, on_free_capacity
from holmes.operator.core.routes import PodRoute, claim_templates, pod_route
from holmes.operator.preview import children
from holmes.plan.dra import join
from tests.helpers.openapi_check import check as check_against
from tests.helpers.plan.dra_helpers import aligned_slices, dra_node, gpu, rail, rslice

FACTS = placement_facts.gather(placement_facts.builtin_cost_model())
SCHEMAS = json.loads((Path(__file__).parent / "data" / "k8s-1.34-dra-schemas.json").read_text())


def net(node: dict, slices: list[dict]):
    (joined,) = join([node], slices)
    return FACTS.network(joined)


def requests(route: PodRoute) -> dict[str, dict]:
    assert route.claim is not None
    return {r["name"]: r["exactly"] for r in route.claim.spec["spec"]["devices"]["requests"]}


def test_a_nic_on_each_gpus_pcie_root_when_the_attributes_allow():
    r = pod_route(net(dra_node("a"), aligned_slices("a", gpus=4)), "a", gpus=4)
    assert r.claim is not None and r.claim.aligned and r.claim.gpus and not r.ipc_lock and not r.resources
    reqs = requests(r)
    assert sorted(reqs) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3", "nic-0", "nic-1", "nic-2", "nic-3"]
    assert reqs["gpu-0"] == {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}
    assert reqs["nic-2"]["deviceClassName"] == "dranet"
    cel = reqs["nic-2"]["selectors"][0]["cel"]["expression"]
    assert cel.startswith('device.attributes["dra.net"].rdma == true') and '"mlx5_3"' in cel
    assert r.claim.spec["spec"]["devices"]["constraints"][1] == {
        "requests": ["gpu-1", "nic-1"],
        "matchAttribute": "resource.kubernetes.io/pcieRoot",
    }
    assert r.env["HOLMES_HOST_HCAS"] == "mlx5_0,mlx5_1,mlx5_2,mlx5_3"


def test_without_roots_or_with_fewer_rails_the_devices_are_asked_for_unaligned():
    no_roots = [
        rslice("a", "dra.net", [rail(i) for i in range(4)]),
        rslice("a", "gpu.nvidia.com", [gpu(i) for i in range(4)]),
    ]
    r = pod_route(net(dra_node("a"), no_roots), "a", gpus=4)
    assert r.claim is not None and not r.claim.aligned
    assert {k: v["count"] for k, v in requests(r).items()} == {"gpus": 4, "nics": 4}
    assert "constraints" not in r.claim.spec["spec"]["devices"]
    two_rails = [
        rslice("a", "dra.net", [rail(0, root="r0"), rail(1, root="r1")]),
        rslice("a", "gpu.nvidia.com", [gpu(i, root=f"r{i % 2}") for i in range(4)]),
    ]
    r = pod_route(net(dra_node("a"), two_rails), "a", gpus=4)
    assert not r.claim.aligned and {k: v["count"] for k, v in requests(r).items()} == {"gpus": 4, "nics": 2}


def test_device_plugin_gpus_keep_their_limit_and_only_the_nics_are_claimed():
    r = pod_route(net(dra_node("a", gpus_allocatable=8), aligned_slices("a")), "a", gpus=8)
    assert r.claim is not None and not r.claim.gpus and list(requests(r)) == ["nics"]
    # a node without DRA devices renders as before
    assert pod_route(net(dra_node("b", gpus_allocatable=8), []), "b", gpus=8).claim is None


def test_an_sriov_island_setting_keeps_its_vfs_and_claims_only_the_gpus():
    islands = (
        IslandNetwork(cluster="east", nic="infiniband", sriov=Sriov(networks=("ns/rail0",), resource="v/f")),
    )
    r = pod_route(net(dra_node("a"), aligned_slices("a")), "a", gpus=8, islands=islands)
    assert r.resources == {"v/f": 1} and list(requests(r)) == ["gpus"]


def dra_children(gpus: int = 8) -> list[dict]:
    from holmes.cli import load_nodes

    job = yaml.safe_load(open("examples/jobs/gpt-7b-zones.yaml"))
    return children(job, load_nodes("examples/nodes/dra.yaml"))


def test_the_operator_creates_one_template_and_every_pod_claims_it():
    objs = dra_children()
    templates = [o for o in objs if o["kind"] == "ResourceClaimTemplate"]
    pods = [o for o in objs if o["kind"] == "Pod"]
    assert len(templates) == 1 and len(pods) == 8
    name = templates[0]["metadata"]["name"]
    assert (
        name.startswith("gpt-7b-devices-")
        and templates[0]["metadata"]["labels"]["holmes.dev/job-name"] == "gpt-7b"
    )
    for p in pods:
        assert p["spec"]["resourceClaims"] == [{"name": "devices", "resourceClaimTemplateName": name}]
        c = p["spec"]["containers"][0]
        assert c["resources"]["claims"] == [{"name": "devices"}]
        assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
        assert "add" not in c["securityContext"]["capabilities"]  # memlock: the runtime's


def test_a_volcano_podgroup_asks_for_no_gpus_its_pods_claim_through_dra():
    """Volcano's queue admits a group only when it can hold minResources; DRA nodes advertise no
    nvidia.com/gpu, so a group asking for them would wait for ever."""
    from holmes.cli import load_nodes

    job = yaml.safe_load(open("examples/jobs/gpt-7b-zones.yaml"))
    job["spec"].setdefault("template", {}).setdefault("spec", {})["schedulerName"] = "volcano"
    (pg,) = [o for o in children(job, load_nodes("examples/nodes/dra.yaml")) if o["kind"] == "PodGroup"]
    assert pg["spec"]["minMember"] == 8 and "nvidia.com/gpu" not in pg["spec"].get("minResources", {}), pg


def test_holmes_plan_pods_shows_the_claims(capsys):
    main(["plan", "--nodes", "examples/nodes/dra.yaml", "--job", "examples/jobs/gpt-7b-zones.yaml", "--pods"])
    items = yaml.safe_load(capsys.readouterr().out)["items"]
    assert [o["kind"] for o in items][:3] == ["ConfigMap", "Service", "ResourceClaimTemplate"]


# ---- the rendered fields against the Kubernetes 1.34 API's schemas -------------------------------


def check(value, schema, path="$"):
    return check_against(value, schema, SCHEMAS["$defs"], path)


def test_the_validator_catches_what_the_api_server_would_refuse():
    tpl = next(o for o in dra_children() if o["kind"] == "ResourceClaimTemplate")
    bad = json.loads(json.dumps(tpl))
    bad["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClass"] = "x"  # misspelt
    del bad["spec"]["spec"]["devices"]["constraints"][0]["requests"]
    bad["spec"]["spec"]["devices"]["requests"][1]["exactly"]["count"] = "1"
    errors = check(bad, SCHEMAS["ResourceClaimTemplate"])
    assert any("unknown field deviceClass" in e for e in errors)
    assert any(".count: '1' is not integer" in e for e in errors)
    assert len(errors) >= 2


@pytest.mark.parametrize("aligned", [True, False])
def test_rendered_templates_and_pod_claims_match_the_api_schema(aligned):
    objs = dra_children()
    if not aligned:  # the unaligned shape: GPUs and NICs as two requests
        gpus = rslice("a", "gpu.nvidia.com", [gpu(0), gpu(1)])
        r = pod_route(net(dra_node("a"), [rslice("a", "dra.net", [rail(0)]), gpus]), "a", gpus=2)
        assert sorted(requests(r)) == ["gpus", "nics"]
        objs = claim_templates("job", "ns", [r], {})
    for o in objs:
        if o["kind"] == "ResourceClaimTemplate":
            assert check(o, SCHEMAS["ResourceClaimTemplate"]) == []
        if o["kind"] == "Pod":
            for i, c in enumerate(o["spec"]["resourceClaims"]):
                assert (
                    check(c, {"$ref": "#/$defs/io.k8s.api.core.v1.PodResourceClaim"}, f"resourceClaims[{i}]")
                    == []
                )
            res = o["spec"]["containers"][0]["resources"]
            assert check(res, {"$ref": "#/$defs/io.k8s.api.core.v1.ResourceRequirements"}) == []


# ---- capacity: a DRA node's GPUs are booked once ------------------------------------------------


def gpu_route_nodes(route: str) -> list[dict]:
    """examples/nodes/dra.yaml with its GPUs from DRA, or from the device plugin (the GPU slices
    dropped, nvidia.com/gpu allocatable instead); the NICs come from DRANET either way."""
    from holmes.cli import load_nodes
    from holmes.plan.dra import DEVICES_KEY

    nodes = load_nodes("examples/nodes/dra.yaml")
    if route == "dra":
        return nodes
    out = []
    for n in nodes:
        n = copy.deepcopy(n)
        n[DEVICES_KEY] = [s for s in n[DEVICES_KEY] if s["driver"] != "gpu.nvidia.com"]
        n["status"]["allocatable"]["nvidia.com/gpu"] = "8"
        out.append(n)
    return out


def zones_job(name: str, gpus: int) -> dict:
    job = yaml.safe_load(open("examples/jobs/gpt-7b-zones.yaml"))
    job["metadata"].update(name=name, namespace="default", uid=f"uid-{name}")
    job["spec"]["nodes"]["gpusPerNode"] = gpus
    return job


def place_beside(pods: list[dict], nodes: list[dict], job: dict):
    where = Placement(
        placement_facts.gather(placement_facts.builtin_cost_model(), Workloads(pods=pods)), nodes, job
    )
    return on_free_capacity(nodes, load_job(job), where)


@pytest.mark.parametrize("route", ["dra", "device-plugin"])
@pytest.mark.parametrize("slim", [False, True])
def test_two_jobs_never_share_a_nodes_gpus_whichever_route_offers_them(route, slim):
    nodes = gpu_route_nodes(route)
    first = [o for o in children(zones_job("first", 4), nodes) if o["kind"] == "Pod"]
    assert len(first) == 8
    for p in first:  # the GPUs come with the claim, or as a limit: counted the same
        assert capacity.held(p) == {"nvidia.com/gpu": 4.0}
        limits = p["spec"]["containers"][0]["resources"].get("limits", {})
        assert ("nvidia.com/gpu" in limits) == (route == "device-plugin")
    pods = [capacity.slim_pod(p) for p in first] if slim else first
    # half of every node's GPUs are the first job's: another 4-GPU job fits beside it...
    assert len(place_beside(pods, nodes, zones_job("second", 4)).nodes) == 8
    # ...an 8-GPU one waits for them, saying what is free
    with pytest.raises(WaitingForCapacity) as e:
        place_beside(pods, nodes, zones_job("third", 8))
    assert "held by default/first (8 nodes)" in str(e.value)
