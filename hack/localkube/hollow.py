"""Hollow nodes on kwok, the I/O part: thousands of Nodes against the real API server, etcd,
scheduler and controller manager, whose pods are reported Running and then Succeeded or Failed
on a schedule without any process being started.

A topology's ``playedBy: kwok`` nodes (topology.py) are these: ``make cluster-up`` (controlplane.py)
starts the cluster's one kwok process (``kwok_command``; ``sigs.k8s.io/kwok``, built by
hack/build-k8s.sh into the binaries' cache) and registers them (``register``: hollow_nodes.node_body,
annotated ``kwok.x-k8s.io/node=fake``). kwok does what their kubelets would: it holds and renews
each node's Lease in ``kube-node-lease`` and plays Holmes' Stages (``kwok-stages.yaml``): a node
Ready, its status rewritten every ``statusSeconds``; a bound pod Running after ``startSeconds``,
then Succeeded or Failed as its annotations say; a deleted pod deleted for good. Registration
lifts the not-ready taint the TaintNodesByCondition admission puts on new nodes at once (the
node lifecycle controller would, on its next pass).

Churn from outside goes through the API (the functions below, which the benches call): a pod
annotated to fail or to finish, a node (and its pods) annotated not ready.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from . import hollow_nodes as hn
from .controlplane import binary

NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


# ---- registration ----------------------------------------------------------------------------
def api_client(kubeconfig: str, pool: int = 20) -> client.ApiClient:
    """A client for ``kubeconfig`` with room for register's parallel requests."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)


def register(core: client.CoreV1Api, bodies: list[dict], workers: int = 16) -> None:
    """Create (or refresh the labels of) each Node for kwok to play (``node_body``'s, or a test's
    own annotated ``KWOK_NODE``) and lift the not-ready taint."""

    def one(body: dict) -> None:
        name = body["metadata"]["name"]
        if (body["metadata"].get("annotations") or {}).get(hn.KWOK_NODE) != hn.KWOK_MANAGED:
            raise ValueError(
                f"node {name}: not annotated {hn.KWOK_NODE}={hn.KWOK_MANAGED}: kwok would not play it"
            )
        try:
            got = json.loads(core.create_node(body, _preload_content=False).data)
        except ApiException as e:
            if e.status != 409:
                raise
            meta = {"labels": body["metadata"]["labels"], "annotations": body["metadata"]["annotations"]}
            got = json.loads(core.patch_node(name, {"metadata": meta}, _preload_content=False).data)
        taints = (got.get("spec") or {}).get("taints") or []
        kept = [t for t in taints if t["key"] not in NOT_READY_TAINTS]
        if kept != taints:
            core.patch_node(name, {"spec": {"taints": kept}}, _preload_content=False)

    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, bodies))


# ---- churn (through the API; kwok's Stages act on it) -----------------------------------------
def _annotate_pod(core: client.CoreV1Api, ns: str, name: str, key: str, value: str | None) -> bool:
    try:
        core.patch_namespaced_pod(
            name, ns, {"metadata": {"annotations": {key: value}}}, _preload_content=False
        )
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def fail_pod(core: client.CoreV1Api, ns: str, name: str) -> bool:
    """The pod fails (exit 1) as soon as it runs; False if it is gone."""
    return _annotate_pod(core, ns, name, hn.FAIL, "true")


def finish_pod(core: client.CoreV1Api, ns: str, name: str) -> bool:
    """The pod ends (exit 0) as soon as it runs; False if it is gone."""
    return _annotate_pod(core, ns, name, hn.FINISH, "true")


def set_not_ready(core: client.CoreV1Api, node: str, not_ready: bool) -> int:
    """A node whose container runtime is down (``not_ready``) reports Ready=False and does
    nothing for its pods (no status, no deletion confirmed) until it is back; returns how many
    of its pods were marked."""
    value = "true" if not_ready else None
    pods = json.loads(
        core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}", _preload_content=False).data
    )["items"]
    marked = [
        p["metadata"] for p in pods if not_ready or hn.NOT_READY in (p["metadata"].get("annotations") or {})
    ]
    if not_ready:  # its pods first: kwok must not act on them once the node is down
        marked = [m for m in marked if _annotate_pod(core, m["namespace"], m["name"], hn.NOT_READY, value)]
    core.patch_node(node, {"metadata": {"annotations": {hn.NOT_READY: value}}}, _preload_content=False)
    if not not_ready:
        marked = [m for m in marked if _annotate_pod(core, m["namespace"], m["name"], hn.NOT_READY, None)]
    return len(marked)


# ---- kwok --------------------------------------------------------------------------------------
def kwok_command(kubeconfig: str, config_file: str, lease_seconds: float, kwok: str = "") -> list[str]:
    """kwok managing the nodes annotated for it, with Holmes' Stages; the Lease's duration is 4
    renewal periods, as the kubelet's (40 s for a 10 s renewal)."""
    return [
        kwok or binary("kwok"),
        f"--kubeconfig={kubeconfig}",
        f"--config={config_file}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={hn.KWOK_NODE}={hn.KWOK_MANAGED}",
        f"--node-lease-duration-seconds={max(1, round(4 * lease_seconds))}",
    ]
