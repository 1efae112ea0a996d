"""Running an external-framework HolmesJob on the local control plane and collecting what its
pods printed: shared by the per-framework cluster tests."""

from __future__ import annotations

import json
import time
from pathlib import Path

import yaml
from holmes_dev.jobs import holmes_job

from holmes.contract import Layout
from localkube.operatorproc import OperatorProcess, install_crd
from tests.helpers import polling
from tests.helpers.operator.cluster_helpers import host_volume

PROGRAMS = Path(__file__).resolve().parent / "programs"
PROGRAMS_MOUNT = "/holmes-programs"
LINK_LAYER = {"infiniband": "InfiniBand", "roce": "Ethernet"}


def mount_programs(pod: dict) -> None:
    """Mount PROGRAMS read-only at PROGRAMS_MOUNT in each container of ``pod`` (a pod spec): the
    user's program is in no image, so it reaches the pods as a user's would, a volume."""
    host_volume(pod, "holmes-programs", {"path": str(PROGRAMS), "type": "Directory"}, PROGRAMS_MOUNT, True)


def framework_job(
    name: str, ns: str, framework: str, image: str, program: str, gpus: int, **parallelism
) -> dict:
    """A HolmesJob of ``framework`` whose pods run ``image`` (``cluster.framework_image``) with
    the command ``python <PROGRAMS_MOUNT>/<program>``, PROGRAMS a read-only hostPath volume."""
    spec = {
        "framework": framework,
        "model": {"layers": 8, "hiddenSize": 64, "attentionHeads": 4, "seqLength": 32, "vocabSize": 128},
        "training": {
            "globalBatchSize": 12 * gpus,
            "microBatchSize": 1,
            "iterations": 1,
            "learningRate": 1.0e-3,
        },
        "nodes": {"count": 6, "gpusPerNode": gpus, "clusterLabel": "kubernetes.io/os"},
        "parallelism": {"pipeline": 3, **parallelism},
        "runPolicy": {"backoffLimit": 0},
        "template": {
            "spec": {
                "containers": [
                    {"name": "trainer", "image": image, "command": ["python", f"{PROGRAMS_MOUNT}/{program}"]}
                ],
            }
        },
    }
    mount_programs(spec["template"]["spec"])
    return holmes_job(name, spec, ns)


def run_job(cluster, namespace: str, tmp_path: Path, manifest: dict, timeout: float = 420):
    """Apply the job under a fresh operator, wait for it to finish; (phase, seconds, Layout,
    {node rank: trainer log})."""
    install_crd(cluster.kubeconfig)
    name = manifest["metadata"]["name"]
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log").start()
    try:
        started = time.monotonic()
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest))

        def finished():
            r = cluster.kubectl("get", "hj", name, "-n", namespace, "-o", "json", check=False)
            st = json.loads(r.stdout).get("status", {}) if r.returncode == 0 else {}
            for c in st.get("conditions") or []:
                if c["type"] == "Stalled" and c["status"] == "True":
                    return "Stalled: " + c.get("message", "")
            return st.get("phase") if st.get("phase") in ("Succeeded", "Failed") else None

        phase = polling.wait_for(f"job {name} to finish", finished, timeout, 2, detail=lambda: op.tail(40))
        seconds = time.monotonic() - started
        pods = cluster.get_json("pods", "-n", namespace, "-l", f"holmes.dev/job-name={name}")["items"]
        logs = {
            int(p["metadata"]["labels"]["holmes.dev/node-rank"]): cluster.pod_log(
                namespace, p["metadata"]["name"], "trainer"
            )
            for p in pods
        }
        assert phase == "Succeeded", "\n".join(v[-3000:] for v in logs.values()) + op.tail(40)
    finally:
        op.stop()
    cm = cluster.get_json("configmap", f"{name}-layout", "-n", namespace)
    return phase, seconds, Layout.from_json(cm["data"]["layout.json"]), logs


def json_lines(text: str, key: str) -> list[dict]:
    """The ``{"<key>": ...}`` objects printed in a log (prefixes such as torchrun's ignored)."""
    out, decoder, mark = [], json.JSONDecoder(), f'{{"{key}"'
    for line in text.splitlines():
        start = line.find(mark)
        while start >= 0:  # each object alone: another process's output may share its line
            try:
                out.append(decoder.raw_decode(line[start:])[0][key])
            except (ValueError, KeyError):
                pass
            start = line.find(mark, start + 1)
    return out


def island_net(layout: Layout, nic_of: dict[str, str], ranks) -> str | None:
    """The truth the hook must match: none for a group inside one node (left to NCCL), else IB
    iff every member's node is of one RDMA NIC kind (one site, so one island)."""
    if len({r // layout.gpus_per_node for r in ranks}) == 1:
        return None
    kinds = {nic_of[layout.nodes[r // layout.gpus_per_node]] for r in ranks}
    return "IB" if len(kinds) == 1 and kinds <= set(LINK_LAYER) else "Socket"
