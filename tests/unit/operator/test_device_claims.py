"""Capacity counts the GPUs DRA ResourceClaims hold (core/device_claims.py), whoever's: plain
dicts as the API server serves resource.k8s.io/v1 ResourceClaims, nodes with ResourceSlices."""

from __future__ import annotations

import pytest

from holmes.contract import load_job
from holmes.operator import placement_facts
from holmes.operator.core import capacity, child_names, device_claims
from holmes.operator.core.capacity import Ledger, WaitingForCapacity, Workloads
from holmes.operator.core.placement import Placement, on_free_capacity
from holmes.plan import classify_nodes, dra
from tests.helpers.operator.opfixtures import manifest
from tests.helpers.plan.dra_helpers import aligned_slices, dra_node

NODES = ("dra-0", "dra-1")


def nodes() -> list[dict]:
    """Two nodes whose 2 GPUs and 2 RDMA NICs each are published only as DRA devices."""
    return dra.join([dra_node(n) for n in NODES], [s for n in NODES for s in aligned_slices(n, gpus=2)])


def claim(name, node, devices, driver="gpu.nvidia.com", reserved_for=(), ns="other", **result) -> dict:
    """A ResourceClaim as the scheduler leaves it once allocated on ``node`` (None: not yet)."""
    c: dict = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "resourceVersion": "7"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": driver}}]}},
        "status": {},
    }
    if node is not None:
        results = [{"request": "gpus", "driver": driver, "pool": node, "device": d} | result for d in devices]
        on_node = {"key": "metadata.name", "operator": "In", "values": [node]}
        c["status"]["allocation"] = {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [on_node]}]},
        }
        c["status"]["reservedFor"] = [{"resource": "pods", "name": p, "uid": p} for p in reserved_for]
    return c


def holmes_pod(name, node, job="j", ns="ns", annotated=True) -> dict:
    """A Holmes DRA pod: no GPU limit; the operator notes its claim's GPUs unless it is older."""
    ann = {child_names.ANN_NODE: node}
    if annotated:
        ann[child_names.ANN_CLAIM_GPUS] = "2"
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": name,
            "labels": {child_names.LABEL_JOB: job, child_names.LABEL_MANAGED_BY: child_names.MANAGED_BY},
            "annotations": ann,
        },
        "spec": {"nodeName": node, "containers": [{"name": "trainer"}]},
        "status": {"phase": "Running"},
    }


def ledger(pods=(), claims=(), skip_job="") -> Ledger:
    holds = device_claims.holds(claims, nodes(), "gpu.nvidia.com")
    return Ledger.of(pods, skip_job=skip_job, claims=holds)


def free_gpus(led: Ledger) -> dict[str, int]:
    view, _ = capacity.free_view(nodes(), capacity.PodShape({}), led)
    return {n.name: n.gpus for n in classify_nodes(view)}


def test_another_workloads_claim_lowers_its_nodes_free_gpus():
    led = ledger(claims=[claim("theirs", "dra-0", ["gpu-0"], reserved_for=["their-pod"])])
    assert free_gpus(led) == {"dra-0": 1, "dra-1": 2}
    assert led.holders["dra-0"] == {""}  # other pods, in the waiting message


def test_a_holmes_pod_with_its_note_and_an_allocated_claim_counts_once():
    pod = holmes_pod("j-1-0", "dra-0")
    mine = claim("j-1-0-devices", "dra-0", ["gpu-0", "gpu-1"], reserved_for=["j-1-0"], ns="ns")
    led = ledger([pod], [mine])
    assert led.used["dra-0"]["nvidia.com/gpu"] == 2 and free_gpus(led)["dra-0"] == 0
    assert led.holders["dra-0"] == {"ns/j"}  # the claim is held by the pod's job


def test_a_claim_not_allocated_yet_leaves_the_note_to_count():
    led = ledger([holmes_pod("j-1-0", "dra-0")], [claim("j-1-0-devices", None, [])])
    assert led.used["dra-0"]["nvidia.com/gpu"] == 2


def test_a_holmes_pod_of_an_older_operator_without_the_note_counts_its_allocated_claim():
    pod = holmes_pod("j-1-0", "dra-1", annotated=False)
    led = ledger([pod], [claim("c", "dra-1", ["gpu-0", "gpu-1"], reserved_for=["j-1-0"], ns="ns")])
    assert free_gpus(led)["dra-1"] == 0


def test_a_claim_on_another_drivers_devices_counts_no_gpu():
    nics = claim("nics", "dra-0", ["nic-0", "nic-1"], driver="dra.net", reserved_for=["p"])
    assert free_gpus(ledger(claims=[nics])) == {"dra-0": 2, "dra-1": 2}


def test_admin_access_shared_devices_and_foreign_selectors_count_what_the_scheduler_counts():
    watcher = claim("monitor", "dra-0", ["gpu-0", "gpu-1"], adminAccess=True)  # takes no device
    a = claim("a", "dra-1", ["gpu-0"])
    b = claim("b", "dra-1", ["gpu-0"])  # the same device, shared by two claims: one GPU
    anywhere = claim("net-attached", "dra-0", ["gpu-0"])
    anywhere["status"]["allocation"]["nodeSelector"] = None  # not a node's own device
    unknown = claim("ghost", "dra-0", ["gpu-7"])  # no slice lists it: discovery counts it nowhere
    assert free_gpus(ledger(claims=[watcher, a, b, anywhere, unknown])) == {"dra-0": 2, "dra-1": 1}


def test_the_job_being_planned_does_not_count_its_own_pods_claims():
    pod = holmes_pod("j-1-0", "dra-0")
    c = claim("j-1-0-devices", "dra-0", ["gpu-0", "gpu-1"], reserved_for=["j-1-0"], ns="ns")
    assert "dra-0" not in ledger([pod], [c], skip_job="ns/j").used
    pod["status"]["phase"] = "Failed"  # ended; the claim controller has not freed its claim yet
    assert "dra-0" not in ledger([pod], [c], skip_job="ns/j").used
    assert ledger([pod], [c], skip_job="ns/other").holders["dra-0"] == {"ns/j"}


def test_the_slim_claim_the_cache_keeps_counts_as_the_full_one():
    full = claim("c", "dra-0", ["gpu-0", "gpu-1"], reserved_for=["p"])
    full["status"]["allocation"]["devices"]["config"] = [{"source": "FromClass", "opaque": {"driver": "x"}}]
    slim = device_claims.slim_claim(full)
    held = device_claims.holds([slim], nodes(), "gpu.nvidia.com")
    assert held == device_claims.holds([full], nodes(), "gpu.nvidia.com") and held[0].gpus == 2
    assert "config" not in slim["status"]["allocation"]["devices"] and "spec" not in slim


def test_a_job_waits_while_another_workloads_claim_holds_a_node_it_needs():
    j = manifest("j", count=2, gpus=2)
    j["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
    seen = Workloads(claims=[claim("theirs", "dra-0", ["gpu-0", "gpu-1"], reserved_for=["their-pod"])])
    facts = placement_facts.gather(placement_facts.builtin_cost_model(), seen)
    with pytest.raises(WaitingForCapacity) as e:
        on_free_capacity(nodes(), load_job(j), Placement(facts, nodes(), j))
    assert "held by other pods (1 node)" in str(e.value)
    free = placement_facts.gather(placement_facts.builtin_cost_model(), Workloads())
    assert sorted(on_free_capacity(nodes(), load_job(j), Placement(free, nodes(), j)).nodes) == list(NODES)


def test_the_fields_read_are_the_resource_v1_apis():
    """Every field the slim claim keeps is one the API's ResourceClaim status has (the client's
    models are generated from the Kubernetes OpenAPI): a misspelt field would read as absent."""
    from kubernetes import client

    def fields(model) -> set[str]:
        return set(model.attribute_map.values())

    slim = device_claims.slim_claim(claim("c", "dra-0", ["gpu-0"], reserved_for=["p"], adminAccess=False))
    st = slim["status"]
    assert set(st) <= fields(client.V1ResourceClaimStatus)
    assert set(st["allocation"]) <= fields(client.V1AllocationResult)
    assert set(st["allocation"]["devices"]) <= fields(client.V1DeviceAllocationResult)
    assert set(st["allocation"]["devices"]["results"][0]) <= fields(client.V1DeviceRequestAllocationResult)
    assert set(st["reservedFor"][0]) <= fields(client.V1ResourceClaimConsumerReference)
    term = st["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]
    assert set(term) <= fields(client.V1NodeSelectorTerm)
    assert set(term["matchFields"][0]) <= fields(client.V1NodeSelectorRequirement)
