"""Operator benchmark: time from `kubectl apply` of a HolmesJob to all its pods created, for
jobs of 8, 64, 256 and 1,024 nodes, against the real local control plane; and the operator's
memory. Target for 1,024 nodes: <= 10 s and <= 1.3x creating the same pods directly (exit 1 if
missed).

The GPU nodes (8 GPUs each, three islands: InfiniBand and RoCE labelled the labeller's way,
InfiniBand labelled NFD's) are hollow nodes, a topology's ``playedBy: kwok`` nodes
(hack/localkube/hollow_nodes.py) on the private cluster the bench starts with them: the
cluster's kwok heartbeats them and reports their pods Running, as kubelets would, without running
anything (creation is what is measured). Side by side, the floor: the same pod objects created
directly with the same client parallelism, so the ratio shows what planning + reconciling adds.

    .venv/bin/python bench/operator_apply.py                 # starts a private local cluster
    .venv/bin/python bench/operator_apply.py --sizes 8,64

With ``$HOLMES_KUBECONFIG`` the bench uses that cluster instead, which must already play its
nodes: ``--write-topology FILE`` writes them (the same ``--sizes``), then ``make cluster-up
TOPOLOGY=FILE``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "hack")]  # the localkube harness (not part of the holmes package)

import yaml  # noqa: E402
from holmes_dev.jobs import holmes_job  # noqa: E402
from holmes_dev.kubectl import run_kubectl  # noqa: E402
from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from localkube import hollow_nodes as hn  # noqa: E402
from localkube.operatorproc import OperatorProcess, install_crd  # noqa: E402

ISLANDS = 3  # of the bench's hollow nodes (hollow_nodes.ISLAND_KINDS: IB, RoCE, IB through NFD)


def job(name: str, ns: str, nodes: int) -> dict:
    return holmes_job(
        name,
        {
            "model": {
                "layers": 32,
                "hiddenSize": 4096,
                "attentionHeads": 32,
                "seqLength": 2048,
                "vocabSize": 50257,
            },
            "training": {
                # 64 sequences per node: every size has a plan (pipeline x data = all GPUs)
                "globalBatchSize": max(4096, 64 * nodes),
                "microBatchSize": 1,
                "iterations": 10,
                "learningRate": 1.0e-4,
            },
            "nodes": {
                "count": nodes,
                "gpusPerNode": 8,
                "selector": {"matchLabels": {hn.HOLLOW: "true"}},
            },
            "template": {
                "spec": {
                    "tolerations": [{"key": hn.HOLLOW, "operator": "Exists"}],
                    "containers": [{"name": "trainer", "command": ["sleep", "3600"]}],
                }
            },
            "runPolicy": {"backoffLimit": 0},
        },
        ns,
    )


POOL_SIZE = 32  # connections to the API server: more than the floor's 16 requests in flight


def api_client(kubeconfig: str, pool_size: int = POOL_SIZE) -> client.ApiClient:
    """A client for ``kubeconfig`` with ``pool_size`` connections. The pool is sized from the
    configuration when the client is made (kubernetes.client.rest), so it is set before."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)


class Bench:
    def __init__(self, kubeconfig: str):
        self.kubeconfig = kubeconfig
        self.api = api_client(kubeconfig)
        self.core = client.CoreV1Api(self.api)
        from localkube.controlplane import binary

        self.kubectl_bin = binary("kubectl")

    def kubectl(self, *args: str, input: str | None = None) -> str:
        r = run_kubectl(self.kubectl_bin, self.kubeconfig, *args, input=input)
        r.check_returncode()
        return r.stdout

    def install_crd(self) -> None:
        install_crd(self.kubeconfig)

    def create_namespace(self, ns: str) -> None:
        """A namespace whose default service account exists (pods are refused before)."""
        self.kubectl("create", "namespace", ns)
        for _ in range(300):
            sa = (
                self.core.read_namespaced_service_account("default", ns, _preload_content=False)
                if self._exists(ns)
                else None
            )
            if sa is not None:
                return
            time.sleep(0.1)
        raise TimeoutError(f"namespace {ns}: no default service account")

    def _exists(self, ns: str) -> bool:
        try:
            self.core.read_namespaced_service_account("default", ns, _preload_content=False)
            return True
        except ApiException:
            return False

    def count_pods(self, ns: str, selector: str) -> int:
        r = self.core.list_namespaced_pod(ns, label_selector=selector, _preload_content=False)
        return len(json.loads(r.data)["items"])

    def wait_pods(self, ns: str, selector: str, n: int, t0: float, timeout: float = 300) -> float:
        while time.monotonic() - t0 < timeout:
            if self.count_pods(ns, selector) >= n:
                return time.monotonic() - t0
            time.sleep(0.02)
        raise TimeoutError(f"{n} pods not created in {timeout}s in {ns}")

    def cleanup_ns(self, ns: str, wait: float = 0) -> None:
        """Delete ``ns`` and its pods, gracefully: their nodes' kwok confirms each deletion, as a
        kubelet would (the pods first: the namespace controller gets to them only later). With
        ``wait``, up to that many seconds until none is left (the nodes free again)."""
        self.core.delete_collection_namespaced_pod(ns, _preload_content=False)
        self.core.delete_namespace(ns, _preload_content=False)
        end = time.monotonic() + wait
        while time.monotonic() < end and self.count_pods(ns, ""):
            time.sleep(0.2)

    def floor(self, ns: str, pods: list[dict]) -> float:
        """The same pods created directly, 16 in flight (the operator's parallelism)."""
        t0 = time.monotonic()
        with ThreadPoolExecutor(16) as ex:
            list(ex.map(lambda p: self.core.create_namespaced_pod(ns, p, _preload_content=False), pods))
        return time.monotonic() - t0


def bench_nodes(
    n: int, labels: Callable[[int], dict] = lambda i: {}, lease_seconds: float = 10.0, islands: int = ISLANDS
) -> dict:
    """The topology (playedBy: kwok) of the bench's ``n`` hollow nodes, node i with ``labels(i)``
    added: what the private cluster starts with, or ``--write-topology`` writes."""
    nodes = hn.hollow_nodes(n, min(islands, n))
    nodes = [replace(x, extra_labels={**x.extra_labels, **labels(i)}) for i, x in enumerate(nodes)]
    return hn.topology_doc(nodes, leaseSeconds=lease_seconds)


def rdma_kind_flags(islands: int = ISLANDS) -> list[str]:
    """The operator's --cluster-rdma-kind for the islands advertised through NFD only."""
    return [f"--cluster-rdma-kind={c}={k}" for c, k in hn.rdma_kinds(islands).items()]


def ready_hollow_nodes(core: client.CoreV1Api) -> int:
    items = json.loads(core.list_node(label_selector=f"{hn.HOLLOW}=true", _preload_content=False).data)[
        "items"
    ]
    return sum(
        1
        for n in items
        if not any(t["key"].startswith("node.kubernetes.io/") for t in n["spec"].get("taints") or [])
        and any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or [])
    )


def hollow_cluster(name: str, topology: dict, tmp: Path, script: str) -> tuple:
    """(the private cluster started with ``topology``'s hollow nodes, or None, its kubeconfig), as
    cluster_kubeconfig; $HOLMES_KUBECONFIG's cluster must already play them (``script``: the
    bench that says how)."""
    path = tmp / "topology.yaml"
    path.write_text(yaml.safe_dump(topology, sort_keys=False))
    cp, kubeconfig = cluster_kubeconfig(name, path)
    want = len(topology["nodes"])
    if not cp:
        api = api_client(kubeconfig)
        try:
            have = ready_hollow_nodes(client.CoreV1Api(api))
        finally:
            api.close()
        if have < want:
            raise RuntimeError(
                f"$HOLMES_KUBECONFIG's cluster has {have} Ready hollow nodes, fewer than {want}: start "
                f"it with `bench/{script}.py --write-topology FILE` (the same options), then "
                "`make cluster-up TOPOLOGY=FILE`, or unset HOLMES_KUBECONFIG for a private cluster"
            )
    return cp, kubeconfig


def start_cluster(state: Path, topology: Path | None = None):
    """A local control plane in ``state`` with ``topology``'s nodes (default: the default one's)."""
    from localkube.controlplane import ControlPlane

    cp = ControlPlane(state)
    cp.dir.mkdir(parents=True, exist_ok=True)
    cp.up(
        topology or REPO / "hack" / "topologies" / "default.yaml",
        log=lambda m: print(f"[localkube] {m}", file=sys.stderr),
    )
    return cp


def measure_apply(b: Bench, op: OperatorProcess, sizes: list[int], repeats: int) -> list[tuple]:
    """(nodes, repeat, apply -> all pods s, direct creation s, operator RSS) per run; the bench
    nodes must be registered and the operator running."""
    rows = []
    for n in sizes:
        for rep in range(repeats):
            ns = f"bench-{n}-{rep}-{os.getpid()}"
            b.create_namespace(ns)
            t0 = time.monotonic()
            b.kubectl("apply", "-f", "-", input=yaml.safe_dump(job("j", ns, n)))
            t_pods = b.wait_pods(ns, "holmes.dev/job-name=j", n, t0)
            rss = op.rss_bytes()
            pods = json.loads(
                b.core.list_namespaced_pod(
                    ns, label_selector="holmes.dev/job-name=j", _preload_content=False
                ).data
            )["items"]
            b.cleanup_ns(ns, wait=300)  # the floor's pods get the nodes back
            fns = f"floor-{n}-{rep}-{os.getpid()}"
            b.create_namespace(fns)
            bare = [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": p["metadata"]["name"], "labels": {"bench": "floor"}},
                    "spec": {k: v for k, v in p["spec"].items() if k not in ("nodeName",)},
                }
                for p in pods
            ]
            t_floor = b.floor(fns, bare)
            b.cleanup_ns(fns, wait=300)
            rows.append((n, rep, t_pods, t_floor, rss))
            print(
                f"  {n:>4} nodes  rep {rep}: {t_pods:6.2f}s apply->all pods, floor {t_floor:6.2f}s, "
                f"operator RSS {rss / 2**20:.0f} MiB",
                file=sys.stderr,
            )
    return rows


# The targets for the largest job (issue: operator under load).
TARGET_NODES, TARGET_SECONDS, TARGET_RATIO = 1024, 10.0, 1.3


def print_apply(rows: list[tuple], repeats: int) -> bool:
    """The table; False when a 1,024-node row misses its targets."""
    print(f"\nHolmesJob apply -> all pods created (local control plane, 2 cores; best of {repeats})")
    print(
        f"{'nodes':>6} {'operator s':>11} {'direct create s':>16} {'ratio':>7} {'pods/s':>8} "
        f"{'operator RSS MiB':>17}"
    )
    ok = True
    for n in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == n]
        best = min(mine, key=lambda r: r[2])
        floor = min(r[3] for r in mine)
        verdict = ""
        if n >= TARGET_NODES:
            met = best[2] <= TARGET_SECONDS and best[2] / floor <= TARGET_RATIO
            ok = ok and met
            verdict = f"  target <= {TARGET_SECONDS:g}s and <= {TARGET_RATIO}x: {'met' if met else 'MISSED'}"
        print(
            f"{n:>6} {best[2]:>11.2f} {floor:>16.2f} {best[2] / floor:>7.2f} {n / best[2]:>8.1f} "
            f"{max(r[4] for r in mine) / 2**20:>17.0f}{verdict}"
        )
    return ok


def cluster_kubeconfig(name: str, topology: Path | None = None) -> tuple:
    """(the private cluster started, or None, its kubeconfig): $HOLMES_KUBECONFIG's cluster when
    set, else a fresh local control plane with ``topology``'s nodes under .holmes/NAME-PID (stop
    it with stop_cluster)."""
    kubeconfig = os.environ.get("HOLMES_KUBECONFIG")
    if kubeconfig:
        return None, kubeconfig
    cp = start_cluster(REPO / ".holmes" / f"{name}-{os.getpid()}", topology)
    return cp, str(cp.kubeconfig)


def stop_cluster(cp) -> None:
    if cp:
        cp.down(log=lambda m: None)
        import shutil

        shutil.rmtree(cp.dir, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,64,256,1024")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--lease-seconds", type=float, default=10.0, help="the hollow nodes' Lease renewal")
    ap.add_argument(
        "--write-topology", metavar="FILE", help="write the hollow nodes' topology (playedBy: kwok) and exit"
    )
    a = ap.parse_args()
    try:
        sizes = [int(s) for s in a.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes {a.sizes!r}: expected whole numbers of nodes separated by commas")
    if not sizes or min(sizes) < 1:
        ap.error(f"--sizes {a.sizes!r}: every size must be at least 1 node")
    topology = bench_nodes(max(sizes), lease_seconds=a.lease_seconds)
    if a.write_topology:
        Path(a.write_topology).write_text(yaml.safe_dump(topology, sort_keys=False))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="holmes-bench-"))
    t = time.monotonic()
    cp, kubeconfig = hollow_cluster("bench-operator", topology, tmp, "operator_apply")
    print(f"{max(sizes)} hollow bench nodes Ready after {time.monotonic() - t:.1f}s", file=sys.stderr)
    b = Bench(kubeconfig)
    op = None
    try:
        b.install_crd()
        op = OperatorProcess(kubeconfig, None, tmp / "operator.log", extra=rdma_kind_flags()).start()
        time.sleep(2)  # let the node index fill
        rss0 = op.rss_bytes()
        rows = measure_apply(b, op, sizes, a.repeats)
    finally:
        if op:
            op.stop()
        stop_cluster(cp)
    ok = print_apply(rows, a.repeats)
    print(f"operator RSS before the first job: {rss0 / 2**20:.0f} MiB")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
