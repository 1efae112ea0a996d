"""What the operator's cluster tests share: applying and reading HolmesJobs with kubectl, and
waiting for a phase or a condition (with the operator's log when a wait times out)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import yaml

from localkube.operatorproc import OperatorProcess
from tests.helpers import polling

SLEEP = ["sh", "-c", "sleep 600"]
HOLD_MOUNT = "/holmes-hold"
# a container command that waits until hold()'s file exists; it stops on SIGTERM (a shell as a
# container's PID 1 ignores it without a trap: the kubelet would wait out the 30 s grace period)
HOLD = ["sh", "-c", f"trap 'exit 143' TERM; while [ ! -e {HOLD_MOUNT}/go ]; do sleep 0.2; done"]


def hold(job: dict, directory: Path) -> Path:
    """Mount ``directory`` (one every pod's user can read: the ``shared_dir`` fixture) at
    HOLD_MOUNT in each container of the job's pods and return the file that ends HOLD: a
    container on a real kubelet node sees only its volumes, not the test's files."""
    pod = job["spec"].setdefault("template", {}).setdefault("spec", {})
    host_volume(pod, "holmes-hold", {"path": str(directory)}, HOLD_MOUNT)
    return directory / "go"


def host_volume(
    pod: dict, name: str, host_path: dict, mount: str, read_only: bool = False, only=None
) -> None:
    """Add the ``hostPath`` volume ``name`` to ``pod`` (a pod spec) and mount it at ``mount`` in
    each of its containers, init containers too (or in the one named ``only``): a container on a
    real kubelet node sees only its volumes, not the test's files."""
    pod["volumes"] = [*pod.get("volumes", []), {"name": name, "hostPath": host_path}]
    entry = {"name": name, "mountPath": mount, **({"readOnly": True} if read_only else {})}
    for c in pod.get("initContainers", []) + pod.get("containers", []):
        if only is None or c["name"] == only:
            c["volumeMounts"] = [*c.get("volumeMounts", []), entry]


SLOWDOWN = Path(__file__).resolve().parents[2] / "e2e" / "operator" / "slowdown"
SLOWDOWN_MOUNT = "/holmes-slowdown"


def slow_trainers(pod: dict, nodes: list[str], seconds: float) -> None:
    """Make the trainer processes on ``nodes`` slower for real (``slowdown/sitecustomize.py`` on
    the trainer container's PYTHONPATH): the folder reaches the container as a read-only
    hostPath volume, since a container on a real kubelet node sees only its volumes."""
    (c,) = (c for c in pod["containers"] if c["name"] == "trainer")
    c["env"] = [
        *c.get("env", []),
        {"name": "PYTHONPATH", "value": SLOWDOWN_MOUNT},
        {"name": "HOLMES_TEST_SLOW_NODES", "value": ",".join(nodes)},
        {"name": "HOLMES_TEST_SLOW_SECONDS", "value": str(seconds)},
    ]
    host_volume(
        pod, "holmes-slowdown", {"path": str(SLOWDOWN)}, SLOWDOWN_MOUNT, read_only=True, only="trainer"
    )


def apply(cluster, obj, check=True):
    return cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj), check=check)


def register_hollow(cluster, nodes: list[dict]) -> None:
    """Register Nodes for the cluster's kwok to play (operatorproc.api_node's): Ready, their
    Leases renewed, their pods reported Running without any process."""
    from kubernetes import client

    from localkube import hollow

    api = cluster.api_client()
    try:
        hollow.register(client.CoreV1Api(api), nodes)
    finally:
        api.close()


def get_job(cluster, ns, name):
    r = cluster.kubectl("get", "holmesjob", name, "-n", ns, "-o", "json", check=False)
    return json.loads(r.stdout) if r.returncode == 0 else None


def pods_of(cluster, ns, name):
    return cluster.get_json("pods", "-n", ns, "-l", f"holmes.dev/job-name={name}")["items"]


def running_operator(
    cluster, namespace: str, tmp_path: Path, extra: list[str] = (), tail: int = 80
) -> Iterator[OperatorProcess]:
    """For a fixture to ``yield from``: an operator watching ``namespace``, stopped at the end
    with its log's last ``tail`` lines printed (pytest shows them with a failed test)."""
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log", extra=extra).start()
    yield op
    op.stop()
    print(op.tail(tail))


def wait_for(what, fn, timeout=90, every=0.3, op=None):
    return polling.wait_for(
        what, fn, timeout, every, detail=(lambda: f"\noperator log:\n{op.tail()}") if op else None
    )


def wait_phase(cluster, ns, name, phase, timeout=90, op=None):
    def check():
        job = get_job(cluster, ns, name)
        return job if job and job.get("status", {}).get("phase") == phase else None

    try:
        return wait_for(f"{name} phase {phase}", check, timeout, op=op)
    except AssertionError:
        raise AssertionError(
            f"{name} never reached {phase}: status "
            f"{json.dumps((get_job(cluster, ns, name) or {}).get('status'), indent=1)}\n"
            + (op.tail() if op else "")
        ) from None


def condition(job, type_):
    # a job just applied has no status until the operator's first write
    return next((c for c in (job.get("status") or {}).get("conditions", []) if c["type"] == type_), {})


def events_of(cluster, ns, name):
    ev = cluster.get_json(
        "events", "-n", ns, "--field-selector", f"involvedObject.name={name},involvedObject.kind=HolmesJob"
    )
    return ev["items"]
