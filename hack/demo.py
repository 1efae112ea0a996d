"""`make demo`'s last act: install the CRD, run the operator, apply a HolmesJob and follow it to
the end, printing the layout the planner chose and the training metrics.

    python hack/demo.py --kubeconfig .holmes/kubeconfig --job examples/holmesjob-demo.yaml

A driver for the local cluster, not part of the holmes package (it only runs kubectl and
`python -m holmes.operator`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from holmes_dev.follow import follow_job, say  # hack/ is this script's folder, first on sys.path
from holmes_dev.kubectl import run_kubectl, wait_established
from holmes_dev.ports import free_port


class Kubectl:
    def __init__(self, binary: str, kubeconfig: str):
        self.binary, self.kubeconfig = binary, kubeconfig

    def __call__(self, *args: str, check: bool = True) -> str:
        r = run_kubectl(self.binary, self.kubeconfig, *args)
        if check and r.returncode:
            raise SystemExit(f"kubectl {' '.join(args)} failed:\n{r.stderr}")
        return r.stdout

    def json(self, *args: str) -> dict | None:
        out = self("get", *args, "-o", "json", check=False)
        return json.loads(out) if out.strip() else None

    def wait_established(self, crd: str) -> None:
        problem = wait_established(self.binary, self.kubeconfig, crd)
        if problem:
            raise SystemExit(problem)


def show_layout(status: dict, layout_json: dict | None) -> None:
    lay = status["layout"]
    say(
        f">> layout {lay['shape']} (pipeline x data x tensor), "
        f"{lay['worldSize']} ranks on {lay['nodes']} nodes"
    )
    say(f"   {'stage':<6}{'island':<26}{'nic':<12}{'layers':<10}nodes")
    for s in lay["stages"]:
        say(f"   {s['index']:<6}{s['island']:<26}{s['nic']:<12}{_layers(s):<10}{', '.join(s['nodes'])}")
    for g in lay["dpGroups"]:
        say(
            f"   data-parallel groups of stage {g['stage']}: {g['size']} ranks, "
            f"NIC kinds {'+'.join(g['nics'])}, "
            f"NCCL net {g['net']}"
        )
    est = lay.get("estimate") or {}
    if est:
        say(
            f"   planner estimate: {est.get('iterationSeconds', 0):.3g} s/iteration, "
            f"{est.get('tflopsPerGpu', 0):.3g} TFLOPS/GPU (A100 cost model)"
        )
    for line in (layout_json or {}).get("explanation", [])[:8]:
        say(f"   | {line}")


def _layers(stage: dict) -> str:
    a, b = stage["layers"]
    return f"{a}-{b - 1}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--job", required=True, help="HolmesJob manifest to apply")
    ap.add_argument("--crd", default="crds/holmesjob.yaml")
    ap.add_argument("--namespace", default="holmes-demo")
    ap.add_argument(
        "--kubectl",
        default=str(Path(os.environ.get("HOLMES_CACHE", Path.home() / ".cache/holmes")) / "bin/kubectl"),
    )
    ap.add_argument("--cluster-rdma-kind", action="append", default=["east=infiniband", "west=roce"])
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--log", default=".holmes/demo-operator.log")
    a = ap.parse_args(argv)
    k = Kubectl(a.kubectl if Path(a.kubectl).exists() else "kubectl", a.kubeconfig)
    import yaml

    with open(a.job) as f:
        name = yaml.safe_load(f)["metadata"]["name"]
    ns = a.namespace

    say(">> installing the HolmesJob CRD")
    k("apply", "-f", a.crd)
    k.wait_established("holmesjobs.holmes.dev")
    if k.json("namespace", ns) is None:
        k("create", "namespace", ns)
    k("delete", "holmesjob", name, "-n", ns, "--ignore-not-found", "--wait=true", "--timeout=60s")

    args = [
        f"--kubeconfig={a.kubeconfig}",
        f"--namespace={ns}",
        "--port-range=20000-29999",  # the node agent's pods share the host network
        *[f"--cluster-rdma-kind={x}" for x in a.cluster_rdma_kind],
    ]
    say(f">> starting the operator (holmes.operator --kubeconfig={a.kubeconfig} ...), log {a.log}")
    with operator_running(args, a.log):
        say(f">> kubectl apply -f {a.job} -n {ns}")
        k("apply", "-f", a.job, "-n", ns)
        return follow(k, ns, name, a.timeout)


@contextlib.contextmanager
def operator_running(args: list[str], log_path: str) -> Iterator[subprocess.Popen]:
    """``python -m holmes.operator`` with ``args`` (plus free liveness and metrics ports and
    plain logs into ``log_path``), stopped on leaving; exits the demo if it dies at start-up."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "holmes.operator",
        *args,
        f"--liveness=http://127.0.0.1:{free_port()}/healthz",
        f"--metrics-port={free_port()}",
        "--log-format=plain",
    ]
    with open(log_path, "ab") as log:
        op = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            time.sleep(2)
            if op.poll() is not None:
                raise SystemExit(f"the operator exited with {op.returncode}; see {log_path}")
            yield op
        finally:
            op.terminate()
            try:
                op.wait(15)
            except subprocess.TimeoutExpired:
                op.kill()


def follow(k: Kubectl, ns: str, name: str, timeout: float) -> int:
    def layout(st: dict) -> None:  # with the planner's explanation, from the layout's ConfigMap
        cm = k.json("configmap", st["layout"]["configMap"], "-n", ns)
        show_layout(st, json.loads(cm["data"]["layout.json"]) if cm else None)

    def status() -> dict:
        return (k.json("holmesjob", name, "-n", ns) or {}).get("status") or {}

    phase = follow_job(name, status, timeout, on_layout=layout)
    say(k("get", "holmesjob", name, "-n", ns, "-o", "wide"))
    rank0 = f"{name}-{(k.json('holmesjob', name, '-n', ns) or {}).get('status', {}).get('attempt', 1)}-0"
    logs = k("logs", rank0, "-n", ns, check=False)
    lines = [json.loads(x) for x in logs.splitlines() if x.startswith('{"holmes"')]
    if lines:
        say(">> training metrics from the rank-0 trainer (its JSON lines)")
        for rec in lines:
            if rec.get("holmes") in ("iteration", "done"):
                say(
                    f"   {rec['holmes']:<9} it {rec.get('iteration'):>3}  "
                    f"loss {rec.get('loss', float('nan')):.4f}  "
                    f"{rec.get('tokensPerSecond', 0):8.0f} tok/s  {rec.get('tflopsPerGpu', 0):.3g} TFLOPS/GPU"
                )
    uid = ((k.json("holmesjob", name, "-n", ns) or {}).get("metadata") or {}).get("uid", "")
    say(">> events")
    say(
        k(
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            f"involvedObject.kind=HolmesJob,involvedObject.uid={uid}",
            "--sort-by=.lastTimestamp",
            check=False,
        )
    )
    say(
        f">> the cluster keeps running for a look around: export KUBECONFIG=$PWD/.holmes/kubeconfig; "
        f"kubectl get hj,pods -n {ns}; `make cluster-down` stops it"
    )
    return 0 if phase == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
