"""CLI: `python -m localkube up|down|status|nodes|agent` (PYTHONPATH=hack)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from .controlplane import REPO, ClusterError, ControlPlane, binary
from .topology import TopologyError

DEFAULT_STATE = REPO / ".holmes" / "cluster"
DEFAULT_MULTI = REPO / ".holmes" / "multicluster"
DEFAULT_TOPOLOGY = REPO / "hack" / "topologies" / "default.yaml"
NODE_COLUMNS = (
    'NAME:.metadata.name,READY:.status.conditions[?(@.type=="Ready")].status,'
    "CLUSTER:.metadata.labels.holmes\\.dev/cluster,"
    "HOLMES-NIC:.metadata.labels.holmes\\.dev/nic,"
    "NIC-GBPS:.metadata.labels.holmes\\.dev/nic-gbps,"
    "NFD-RDMA:.metadata.labels.feature\\.node\\.kubernetes\\.io/rdma\\.available,"
    "GPUS:.status.allocatable.nvidia\\.com/gpu,"
    "TRUE-NIC:.metadata.annotations.localkube\\.holmes\\.dev/true-nic"
)


def link_kubeconfig(cp: ControlPlane, link: Path) -> None:
    """`make cluster-up` promises .holmes/kubeconfig: a copy of the state dir's kubeconfig."""
    link.parent.mkdir(parents=True, exist_ok=True)
    link.write_text(cp.kubeconfig.read_text())
    link.chmod(0o600)


def show_nodes(cp: ControlPlane) -> int:
    r = subprocess.run(
        [
            binary("kubectl"),
            f"--kubeconfig={cp.kubeconfig}",
            "get",
            "nodes",
            "-o",
            f"custom-columns={NODE_COLUMNS}",
        ],
        text=True,
        capture_output=True,
    )
    print(r.stdout, end="")
    if r.returncode:
        print(r.stderr, file=sys.stderr, end="")
        return r.returncode
    rdma = subprocess.run(
        [binary("kubectl"), f"--kubeconfig={cp.kubeconfig}", "get", "nodes", "-o", "json"],
        text=True,
        capture_output=True,
        check=True,
    )
    print("\nRDMA device-plugin resources (status.allocatable):")
    for n in json.loads(rdma.stdout)["items"]:
        res = {k: v for k, v in n["status"]["allocatable"].items() if k.startswith("rdma/")}
        print(f"  {n['metadata']['name']:<10} {', '.join(f'{k}={v}' for k, v in res.items()) or '-'}")
    return 0


def set_power(cp: ControlPlane, node: str, on: bool, log=lambda m: None) -> None:
    """Switch a node's machine off or on: a real node's processes (RealNodes.power), or the node
    agent's powered-off list (read every POWER_POLL_S)."""
    from .agent import POWERED_OFF
    from .topology import AGENT, KUBELET, load_topology

    # the API server answering is enough: a switched-off node's processes are gone (and with its
    # Node deleted, kube-proxy's, until it is switched on again)
    st = cp.state()
    if not st or not cp._ready(st):
        raise ClusterError("the cluster is not running: `make cluster-up` first")
    topo = load_topology(st["topology"])
    if node not in topo.names:
        raise ClusterError(f"no node {node!r} in this cluster's topology (nodes: {', '.join(topo.names)})")
    if topo.node(node).played_by == KUBELET:
        from .controlplane import binary
        from .realnode import NODE_BINARIES, RealNodeError, RealNodes

        bins = {b: binary(b) for b in (*NODE_BINARIES, "kubectl")}
        try:
            RealNodes(cp, cp.state(), bins, log).power(topo.node(node), on)
        except RealNodeError as e:
            raise ClusterError(str(e)) from e
        return
    if topo.node(node).played_by != AGENT:
        raise ClusterError(
            f"{node} is played by {topo.node(node).played_by}, which has no machine to switch off "
            f"(a kwok node goes NotReady with localkube.hollow.set_not_ready)"
        )
    f = cp.dir / POWERED_OFF
    off = set(f.read_text().split()) if f.exists() else set()
    off = off - {node} if on else off | {node}
    tmp = f.with_suffix(".tmp")
    tmp.write_text("".join(f"{n}\n" for n in sorted(off)))
    tmp.replace(f)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="localkube", description=__doc__)
    ap.add_argument("--state-dir", default=os.environ.get("HOLMES_STATE_DIR", str(DEFAULT_STATE)))
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start (or keep) the cluster")
    up.add_argument("--topology", default=os.environ.get("TOPOLOGY") or str(DEFAULT_TOPOLOGY))
    up.add_argument("--kubeconfig-link", default=str(REPO / ".holmes" / "kubeconfig"))
    sub.add_parser("down", help="stop everything recorded in the state dir")
    sub.add_parser("status", help="exit 0 when the cluster runs")
    sub.add_parser("nodes", help="show the nodes and their NIC labels")
    sub.add_parser("agent", help="run the node agent in the foreground (started by `up`)")
    mup = sub.add_parser(
        "multicluster-up", help="one control plane per cluster of the topology; the first is the hub"
    )
    mup.add_argument("--topology", default=os.environ.get("TOPOLOGY") or str(DEFAULT_TOPOLOGY))
    mup.add_argument("--root", default=str(DEFAULT_MULTI))
    mup.add_argument("--members-namespace", default="holmes-system")
    mdown = sub.add_parser("multicluster-down", help="stop what multicluster-up started")
    mdown.add_argument("--root", default=str(DEFAULT_MULTI))
    sub.add_parser("kueue-up", help="start (or keep) the real Kueue on the running cluster")
    sub.add_parser("kueue-down", help="stop Kueue and remove its webhook configurations")
    sub.add_parser("jobset-up", help="start (or keep) the real JobSet controller on the running cluster")
    sub.add_parser("jobset-down", help="stop JobSet and remove its webhook configurations")
    sub.add_parser(
        "trainer-up",
        help="start (or keep) the real Kubeflow Trainer controller on the running cluster (JobSet first)",
    )
    sub.add_parser("trainer-down", help="stop Kubeflow Trainer and remove its webhook configurations")
    power = sub.add_parser("power", help="switch a node's machine off (its pods die) or on")
    power.add_argument("state", choices=("on", "off"))
    power.add_argument("node")
    a = ap.parse_args(argv)
    cp = ControlPlane(a.state_dir)
    try:
        if a.cmd == "up":
            cp.dir.mkdir(parents=True, exist_ok=True)
            cp.up(a.topology, log=lambda m: print(f">> {m}", flush=True))
            link_kubeconfig(cp, Path(a.kubeconfig_link))
            print(f">> export KUBECONFIG={a.kubeconfig_link}  # kubectl: {binary('kubectl')}")
            print(f">> pod logs: {cp.dir / 'pods'}/<namespace>/<pod>/<container>.log")
        elif a.cmd == "kueue-up":
            from .kueue import Kueue

            st = Kueue(cp).up(log=lambda m: print(f">> {m}", flush=True))
            print(f">> kueue {st['version']}: webhook {st['webhook']}; log {cp.dir / 'logs' / 'kueue.log'}")
        elif a.cmd == "kueue-down":
            from .kueue import Kueue

            Kueue(cp).down(log=lambda m: print(f">> {m}", flush=True))
        elif a.cmd == "jobset-up":
            from .jobset import JobSet

            st = JobSet(cp).up(log=lambda m: print(f">> {m}", flush=True))
            print(f">> jobset {st['version']}: webhook {st['webhook']}; log {cp.dir / 'logs' / 'jobset.log'}")
        elif a.cmd == "jobset-down":
            from .jobset import JobSet

            JobSet(cp).down(log=lambda m: print(f">> {m}", flush=True))
        elif a.cmd == "trainer-up":
            from .kftrainer import KFTrainer

            st = KFTrainer(cp).up(log=lambda m: print(f">> {m}", flush=True))
            log = cp.dir / "logs" / "kftrainer.log"
            print(f">> kubeflow trainer {st['version']}: webhook {st['webhook']}; log {log}")
        elif a.cmd == "trainer-down":
            from .kftrainer import KFTrainer

            KFTrainer(cp).down(log=lambda m: print(f">> {m}", flush=True))
        elif a.cmd == "down":
            cp.down(log=lambda m: print(f">> {m}", flush=True))
        elif a.cmd == "multicluster-up":
            from .multicluster import MultiCluster

            mc = MultiCluster(a.root)
            mc.up(a.topology, log=lambda m: print(f">> {m}", flush=True))
            mc.register(a.members_namespace)
            for m in mc.members:
                role = " (also the hub: HolmesJobs and the operator live here)" if m == mc.hub else ""
                print(f">> member {m}{role}: KUBECONFIG={mc.kubeconfig(m)}")
            print(f">> members registered in the hub as Secrets in namespace {a.members_namespace}")
        elif a.cmd == "multicluster-down":
            from .multicluster import MultiCluster

            MultiCluster(a.root).down(log=lambda m: print(f">> {m}", flush=True))
        elif a.cmd == "status":
            ok = cp.running()
            print("running" if ok else "not running")
            return 0 if ok else 1
        elif a.cmd == "nodes":
            if not cp.running():
                raise ClusterError("the cluster is not running: `make cluster-up` first")
            return show_nodes(cp)
        elif a.cmd == "power":
            set_power(cp, a.node, a.state == "on", log=lambda m: print(f">> {m}", flush=True))
        elif a.cmd == "agent":
            from .agent import main as agent_main

            agent_main(a.state_dir)
    except (ClusterError, TopologyError) as e:
        print(f"!! {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
