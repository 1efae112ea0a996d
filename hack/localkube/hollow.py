"""Hollow nodes on kwok: thousands of Nodes against the real API server, etcd, scheduler and
controller manager, whose pods are reported Running and then Succeeded or Failed on a schedule
without any process being started.

    PYTHONPATH=hack .venv/bin/python -m localkube.hollow --kubeconfig K --nodes 2000 --islands 8

Holmes registers the Nodes (hollow_nodes.py: islands of InfiniBand, RoCE and Ethernet, labelled
the labeller's way or NFD's, RDMA device-plugin resources, GPU Feature Discovery's labels, the
HOLLOW taint), annotated ``kwok.x-k8s.io/node=fake``; kwok (``sigs.k8s.io/kwok``, built by
hack/build-k8s.sh into the binaries' cache) does what their kubelets would: it holds and renews
each node's Lease in ``kube-node-lease`` (every ``--lease-seconds``) and plays Holmes' Stages
(``kwok-stages.yaml``): a node Ready, its status rewritten every ``--status-seconds``; a bound pod
Running after ``--start-seconds``, then Succeeded or Failed as its annotations say; a deleted
pod deleted for good. Registration lifts the not-ready taint the TaintNodesByCondition admission
puts on new nodes (the node lifecycle controller that would lift it is off in the local
control plane).

Churn from outside goes through the API (the functions below, which the benches call): a pod
annotated to fail or to finish, a node (and its pods) annotated not ready. This process runs
kwok until SIGTERM/SIGINT, then stops it; ``--unregister`` deletes the Nodes and their Leases.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from . import hollow_nodes as hn
from .controlplane import ClusterError, binary
from .topology import SimNode

log = logging.getLogger("localkube.hollow")
NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
LEASE_NS = "kube-node-lease"


# ---- registration ----------------------------------------------------------------------------
def api_client(kubeconfig: str, pool: int = 20) -> client.ApiClient:
    """A client for ``kubeconfig`` with room for register's parallel requests."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = pool
    return client.ApiClient(cfg)


def register(core: client.CoreV1Api, nodes: list[SimNode], workers: int = 16) -> None:
    """Create (or refresh the labels of) each Node and lift the not-ready taint."""

    def one(n: SimNode) -> None:
        body = hn.node_body(n)
        try:
            got = json.loads(core.create_node(body, _preload_content=False).data)
        except ApiException as e:
            if e.status != 409:
                raise
            meta = {"labels": body["metadata"]["labels"], "annotations": body["metadata"]["annotations"]}
            got = json.loads(core.patch_node(n.name, {"metadata": meta}, _preload_content=False).data)
        taints = (got.get("spec") or {}).get("taints") or []
        kept = [t for t in taints if t["key"] not in NOT_READY_TAINTS]
        if kept != taints:
            core.patch_node(n.name, {"spec": {"taints": kept}}, _preload_content=False)

    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, nodes))


def unregister(api: client.ApiClient, names: list[str], workers: int = 16) -> None:
    """Delete the hollow Nodes and their Leases (their pods are the caller's to delete)."""
    core, leases = client.CoreV1Api(api), client.CoordinationV1Api(api)

    def quiet(fn, *args) -> None:
        try:
            fn(*args, _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                log.warning("%s %s: %s %s", fn.__name__, args[0], e.status, e.reason)

    def one(name: str) -> None:
        quiet(core.delete_node, name)
        quiet(leases.delete_namespaced_lease, name, LEASE_NS)

    with ThreadPoolExecutor(workers) as ex:
        list(ex.map(one, names))


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m localkube.hollow", description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--islands", type=int, default=4)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--lease-seconds", type=float, default=10.0, help="Lease renewal period per node")
    ap.add_argument("--status-seconds", type=float, default=300.0, help="Node status period per node")
    ap.add_argument("--start-seconds", type=float, default=1.0, help="bound -> Running")
    ap.add_argument("--workers", type=int, default=8, help="kwok's parallel stage players")
    ap.add_argument("--unregister", action="store_true", help="delete the nodes and leases, then exit")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if a.lease_seconds <= 0:
        ap.error("--lease-seconds must be > 0")
    try:
        nodes = hn.hollow_nodes(a.nodes, a.islands, a.gpus)
        cfg_text = hn.kwok_config(a.start_seconds, a.status_seconds, a.workers)
    except hn.HollowError as e:
        ap.error(str(e))
    kwok_bin = ""
    if not a.unregister:
        try:
            kwok_bin = binary("kwok")
        except ClusterError as e:
            ap.error(str(e))
    try:
        api = api_client(a.kubeconfig)
    except (OSError, config.ConfigException) as e:
        ap.error(f"--kubeconfig {a.kubeconfig}: {e}")
    if a.unregister:
        unregister(api, [n.name for n in nodes])
        return 0
    with tempfile.TemporaryDirectory(prefix="holmes-kwok-") as tmp:
        cfg_file = Path(tmp) / "kwok.yaml"
        cfg_file.write_text(cfg_text)
        # kwok first: it takes each node up as it is registered (registering first, then starting
        # kwok, left 500 nodes waiting for the last one's registration)
        proc = subprocess.Popen(
            kwok_command(a.kubeconfig, str(cfg_file), a.lease_seconds), stdin=subprocess.DEVNULL
        )

        def stop(*_: object) -> None:
            if proc.poll() is None:
                proc.terminate()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        try:
            t0 = time.monotonic()
            register(client.CoreV1Api(api), nodes)
            log.info(
                "registered %d hollow nodes in %.1fs for %s", len(nodes), time.monotonic() - t0, kwok_bin
            )
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log.info("kwok exited with %s", rc)
    return 0 if rc in (0, -signal.SIGTERM, -signal.SIGINT) else 1


if __name__ == "__main__":
    sys.exit(main())
