"""`make demo-multicluster`'s last act: one HolmesJob trained across two local Kubernetes
clusters (started by `make multicluster-up`, registered as members of the hub), printing the
layout, where each rank runs, the progress and the per-member status.

    python hack/demo_multicluster.py [--root .holmes/multicluster] [--job JOB.yaml]

A driver for the local clusters, not part of the holmes package (it only runs kubectl and
`python -m holmes.operator`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from demo import Kubectl, operator_running, show_layout  # noqa: E402
from holmes_dev.follow import follow_job, say  # noqa: E402

from localkube.controlplane import binary  # noqa: E402
from localkube.multicluster import MEMBERS_NAMESPACE, MultiCluster  # noqa: E402
from localkube.operatorproc import CRD, PORT_RANGE, RDMA_KINDS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".holmes/multicluster")
    ap.add_argument("--job", default="examples/holmesjob-multicluster.yaml")
    ap.add_argument("--namespace", default="holmes-demo")
    ap.add_argument("--timeout", type=float, default=420)
    ap.add_argument("--log", default=".holmes/demo-multicluster-operator.log")
    a = ap.parse_args(argv)
    mc = MultiCluster(a.root)
    if not mc.members:
        raise SystemExit(f"no clusters under {a.root}: run `make multicluster-up` first")
    hub = Kubectl(binary("kubectl"), str(mc.kubeconfig(mc.hub)))
    import yaml

    name = yaml.safe_load(Path(a.job).read_text())["metadata"]["name"]
    ns = a.namespace
    say(f">> clusters: {', '.join(mc.members)}; the hub (operator, HolmesJobs) is {mc.hub}")
    for m in mc.members:
        nodes = mc.kubectl(m, "get", "nodes", "-o", "jsonpath={.items[*].metadata.name}")
        say(f"   member {m}: nodes {nodes}")
    say(">> installing the HolmesJob CRD in the hub; namespace holmes-demo in every member")
    hub("apply", "-f", str(CRD))
    hub.wait_established("holmesjobs.holmes.dev")
    mc.register(MEMBERS_NAMESPACE)
    mc.ensure_namespace(ns)
    hub("delete", "holmesjob", name, "-n", ns, "--ignore-not-found", "--wait=true", "--timeout=60s")

    args = [
        f"--kubeconfig={mc.kubeconfig(mc.hub)}",
        f"--namespace={ns}",
        f"--members-namespace={MEMBERS_NAMESPACE}",
        f"--port-range={PORT_RANGE}",
        *[f"--cluster-rdma-kind={x}" for x in RDMA_KINDS],
    ]
    say(f">> starting the operator against the hub, members from Secrets in {MEMBERS_NAMESPACE}; log {a.log}")
    with operator_running(args, a.log):
        say(f">> kubectl apply -f {a.job} -n {ns}   (in the hub)")
        hub("apply", "-f", a.job, "-n", ns)
        code = follow(mc, hub, ns, name, a.timeout)
        say(f">> kubectl delete holmesjob {name}: the finalizer holmes.dev/member-children holds the job")
        say("   until its pods, ConfigMap and Service are deleted in every member")
        hub("delete", "holmesjob", name, "-n", ns, "--wait=true", "--timeout=90s")
        for m in mc.members:
            left = mc.kubectl(
                m,
                "get",
                "pods,configmaps,services",
                "-n",
                ns,
                "-l",
                f"holmes.dev/job-name={name}",
                "-o",
                "name",
            )
            say(f"   member {m}: {len(left.split())} child object(s) left")
        return code


def follow(mc: MultiCluster, hub: Kubectl, ns: str, name: str, timeout: float) -> int:
    placed = False

    def placement(st: dict) -> None:  # once running: which member cluster each rank's pod is in
        nonlocal placed
        if st.get("launched") and not placed and st.get("phase") == "Running":
            say(">> the pods, in the member clusters their nodes belong to")
            for m in mc.members:
                out = mc.kubectl(
                    m, "get", "pods", "-n", ns, "-l", f"holmes.dev/job-name={name}", "-o", "json"
                )
                for p in json.loads(out)["items"]:
                    env = {e["name"]: e.get("value") for e in p["spec"]["containers"][0]["env"]}
                    say(
                        f"   {m:<6} {p['metadata']['name']:<12} node {p['spec'].get('nodeName')!s:<8} "
                        f"IP {p['status'].get('podIP')!s:<14} rank {env.get('NODE_RANK')}  "
                        f"MASTER_ADDR {env.get('MASTER_ADDR')}"
                    )
            placed = True

    def status() -> dict:
        return (hub.json("holmesjob", name, "-n", ns) or {}).get("status") or {}

    phase = follow_job(name, status, timeout, on_layout=lambda st: show_layout(st, None), on_status=placement)
    say(hub("get", "holmesjob", name, "-n", ns, "-o", "wide"))
    say(">> status.members (per member cluster: reachable, the attempt's pods by phase)")
    st = (hub.json("holmesjob", name, "-n", ns) or {}).get("status") or {}
    for m, e in (st.get("members") or {}).items():
        say(f"   {m}: {json.dumps(e)}")
    say(
        f">> the clusters keep running (KUBECONFIG={mc.kubeconfig(mc.hub)} for the hub); "
        "`make cluster-down` stops them"
    )
    return 0 if phase == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
