"""The real Kubeflow Trainer v2 (``github.com/kubeflow/trainer/v2`` v2.2.0, the ``real_trainer``
fixture) over the real JobSet on the test bed (issue 53). Nothing here plays Trainer's or JobSet's
part:

- a TrainJob on Trainer's own ``torch-distributed`` ClusterTrainingRuntime (as its release ships
  it) runs a torchrun program whose script calls ``init_process_group()`` without a backend on 2
  nodes: Trainer's webhooks and torch plugin (PET_* env) render a JobSet, JobSet its indexed Job,
  the pods run (as host processes, and in containers from the Holmes trainer image of the local
  containers storage), and the TrainJob is Complete, no Holmes label or gate on it;
- a TrainJob on Holmes' ``holmes-torchrun`` runtime (the chart's, ``trainjob.runtime.enabled``)
  renders a JobSet labelled for Holmes' plan, with the degrees its ``runtimePatches`` give, whose
  pods are created at Holmes' scheduling gate with Holmes' launcher before the user's program. No
  Holmes operator runs here, so they stay gated, saying why.
"""

from __future__ import annotations

import json

import pytest
from holmes_dev import images

from holmes.contract.names import LABEL_KUEUE_QUEUE
from holmes.operator.core import jobset_plan as jp
from holmes.operator.core import jobset_status
from localkube.kueue import INTEGRATIONS
from localkube.operatorproc import OperatorProcess, install_crd
from tests.helpers.operator.cluster_helpers import apply, wait_for
from tests.helpers.operator.tas_helpers import (
    ISLANDS,
    assert_pinned_inside_west,
    delete_kueue_objects,
    west_flavor_queue,
)
from tests.helpers.packaging.packaging_helpers import render

pytestmark = pytest.mark.timeout(420)

TRAINJOB = "trainjobs.trainer.kubeflow.org"
JOBSET = "jobsets.jobset.x-k8s.io"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
GATE = "holmes.dev/placement"

# The issue's program: init_process_group() without a backend (gloo for CPU tensors), one
# all_reduce across every rank, the world as torchrun's PET_* settings made it.
PROGRAM = """
import os, torch, torch.distributed as dist
dist.init_process_group()
r, n = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(r + 1)])
dist.all_reduce(t)
assert t.item() == n * (n + 1) / 2, t
print(f"rank {r}/{n} allreduce {t.item():g} backend {dist.get_backend()}",
      f"master {os.environ['MASTER_ADDR']}", flush=True)
dist.destroy_process_group()
"""
# torchrun runs `python -c PROGRAM` per worker (no script file in the image)
ARGS = ["torchrun", "--no-python", "python", "-c", PROGRAM]
# under holmes-torchrun the launcher runs torchrun itself: the program is the user's args
HOLMES_ARGS = ["python", "train.py"]


def trainjob(namespace: str, name: str, runtime: str, trainer: dict, patches: list | None = None) -> dict:
    spec: dict = {
        "runtimeRef": {"name": runtime, "apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime"},
        "trainer": trainer,
    }
    if patches:
        spec["runtimePatches"] = patches
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def conditions(obj: dict) -> dict:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def pods_of(cluster, ns: str, name: str) -> list[dict]:
    return cluster.get_json("pods", "-n", ns, "-l", f"{JOBSET_NAME}={name}")["items"]


def env_of(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


@pytest.mark.parametrize(
    "from_image",
    [
        pytest.param(False, id="host-process", marks=pytest.mark.node_agent),
        pytest.param(True, id="trainer-image"),
    ],
)
def test_a_trainjob_on_trainers_torch_runtime_runs_torchrun_to_complete(
    cluster, real_trainer, namespace, from_image
):
    """2 nodes of Trainer's torch-distributed runtime as its release ships it: JobSet and pods as
    Trainer renders them, both ranks all-reduce over the rendezvous Trainer named, Complete. With
    the runtime's own image (pytorch/pytorch, not in the local storage) the node agent runs the
    command as a host process from the repository's venv; with ``spec.trainer.image`` the trainer
    image, a container from the local containers storage."""
    name = "pair-image" if from_image else "pair"
    trainer: dict = {"numNodes": 2, "command": ARGS}
    if from_image:
        trainer["image"] = images.image_ref("trainer")
    runtime = cluster.get_json("clustertrainingruntimes.trainer.kubeflow.org", "torch-distributed")
    assert runtime["spec"]["mlPolicy"]["torch"] == {}, runtime["spec"]
    apply(cluster, trainjob(namespace, name, "torch-distributed", trainer))

    def complete():
        tj = cluster.get_json(TRAINJOB, name, "-n", namespace)
        conds = conditions(tj)
        assert conds.get("Failed", {}).get("status") != "True", json.dumps(tj.get("status"), indent=1)
        return tj if conds.get("Complete", {}).get("status") == "True" else None

    wait_for("the TrainJob Complete", complete, timeout=240)
    js = cluster.get_json(JOBSET, name, "-n", namespace)
    assert [o["kind"] for o in js["metadata"]["ownerReferences"]] == ["TrainJob"]
    assert conditions(js)["Completed"]["status"] == "True", js.get("status")
    assert "holmes.dev/plan" not in (js["metadata"].get("labels") or {})  # not Holmes' business
    (rjob,) = js["spec"]["replicatedJobs"]
    assert rjob["name"] == "node" and rjob["template"]["spec"]["parallelism"] == 2, rjob

    pods = sorted(pods_of(cluster, namespace, name), key=lambda p: p["spec"]["hostname"])
    assert [p["spec"]["hostname"] for p in pods] == [f"{name}-node-0-0", f"{name}-node-0-1"], pods
    master = f"{name}-node-0-0.{name}"
    for rank, p in enumerate(pods):
        assert p["status"]["phase"] == "Succeeded", p["status"]
        assert not p["spec"].get("schedulingGates"), p["spec"]
        (c,) = p["spec"]["containers"]
        env = env_of(c)
        assert env["PET_NNODES"] == "2" and env["PET_NPROC_PER_NODE"] == "1", env
        assert env["PET_MASTER_ADDR"] == master and env["PET_MASTER_PORT"] == "29500", env
        (cs,) = p["status"]["containerStatuses"]
        # a container from the image, or the agent's host process
        assert cs["imageID"].startswith("sha256:" if from_image else "localkube://host-process"), cs
        log = cluster.pod_log(namespace, p["metadata"]["name"], "node")
        assert f"rank {rank}/2 allreduce 3 backend " in log and f"master {master}" in log, log[-3000:]


@pytest.fixture
def holmes_runtime(cluster, real_trainer):
    """The chart's ClusterTrainingRuntime holmes-torchrun (its trainer image the local one)."""
    repo = images.image_ref("trainer").rsplit(":", 1)[0]
    (rt,) = render(
        {"trainjob.runtime.enabled": "true", "trainer.image.repository": repo},
        extra=["--show-only", "templates/trainjob-runtime.yaml"],
    )
    apply(cluster, rt)
    yield rt
    cluster.kubectl("delete", "clustertrainingruntime", rt["metadata"]["name"], "--ignore-not-found")


def test_a_trainjob_on_holmes_runtime_renders_a_planned_jobset_whose_pods_wait_for_holmes(
    cluster, holmes_runtime, namespace
):
    """The user's TrainJob names holmes-torchrun and gives the degrees as a runtime patch: the
    JobSet carries Holmes' label and the degrees, and its pods wait at Holmes' gate with the
    launcher before the user's torchrun, Trainer's PET_* env and the plan's path."""
    degrees = {"holmes.dev/pipeline": "2", "holmes.dev/data": "1"}
    patch = {
        "manager": "example.com/user",
        "trainingRuntimeSpec": {"template": {"metadata": {"annotations": degrees}}},
    }
    apply(
        cluster,
        trainjob(namespace, "planned", "holmes-torchrun", {"numNodes": 2, "args": HOLMES_ARGS}, [patch]),
    )

    def jobset():
        r = cluster.kubectl("get", JOBSET, "planned", "-n", namespace, "-o", "json", check=False)
        return json.loads(r.stdout) if r.returncode == 0 else None

    js = wait_for("Trainer's JobSet", jobset, timeout=60)
    assert js["metadata"]["labels"]["holmes.dev/plan"] == "enabled", js["metadata"]
    assert {k: js["metadata"]["annotations"].get(k) for k in degrees} == degrees, js["metadata"]

    def both_pods():
        pods = pods_of(cluster, namespace, "planned")
        return pods if len(pods) == 2 else None

    pods = wait_for("both pods", both_pods)
    for p in pods:
        spec = p["spec"]
        assert spec["schedulingGates"] == [{"name": GATE}], spec
        assert not spec.get("nodeName"), spec
        assert "holmes.dev/gated-by" in p["metadata"]["annotations"], p["metadata"]
        (init,) = spec["initContainers"]
        assert init["name"] == "holmes-launch" and init["command"][-2:] == [
            "holmes.launch.install",
            "/holmes-launch",
        ]
        (c,) = spec["containers"]
        assert c["command"] == ["python", "/holmes-launch/launch.py", "--"] and c["args"] == HOLMES_ARGS, c
        env = env_of(c)
        assert env["HOLMES_PLAN"] == "/etc/holmes/plan.json" and env["PET_NNODES"] == "2", env
        assert {"name": "holmes-launch", "mountPath": "/holmes-launch", "readOnly": True} in c["volumeMounts"]
    # the scheduler leaves them alone, saying why
    pod = wait_for(
        "PodScheduled=False SchedulingGated",
        lambda: next(
            (
                p
                for p in pods_of(cluster, namespace, "planned")
                if conditions(p).get("PodScheduled", {}).get("reason") == "SchedulingGated"
            ),
            None,
        ),
        timeout=30,
    )
    assert pod["status"]["phase"] == "Pending", pod["status"]
    cluster.kubectl("delete", TRAINJOB, "planned", "-n", namespace, "--timeout=60s")


def holmes_trainjob(cluster, namespace: str, name: str, pipeline: int, data: int) -> dict:
    """A TrainJob on holmes-torchrun of pipeline x data nodes running PROGRAM, its script from a
    ConfigMap (applied here) that the user mounts by a runtime patch, its degrees the patch's
    annotations."""
    apply(
        cluster,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "train-script", "namespace": namespace},
            "data": {"train.py": PROGRAM},
        },
    )
    pod_patch = {
        "spec": {
            "volumes": [{"name": "script", "configMap": {"name": "train-script"}}],
            "containers": [{"name": "node", "volumeMounts": [{"name": "script", "mountPath": "/workspace"}]}],
        }
    }
    degrees = {"holmes.dev/pipeline": str(pipeline), "holmes.dev/data": str(data)}
    patch = {
        "manager": "example.com/user",
        "trainingRuntimeSpec": {
            "template": {
                "metadata": {"annotations": degrees},
                "spec": {"replicatedJobs": [{"name": "node", "template": {"spec": {"template": pod_patch}}}]},
            }
        },
    }
    trainer = {"numNodes": pipeline * data, "args": ["python", "/workspace/train.py"]}
    return trainjob(namespace, name, "holmes-torchrun", trainer, [patch])


def completion(cluster, namespace: str, name: str):
    """A wait_for check: the TrainJob once Complete; a Failed one fails with its pods' last
    status and log (a failed JobSet's pods go)."""
    seen: dict[str, str] = {}

    def complete():
        for p in pods_of(cluster, namespace, name):
            if p["status"].get("phase") in ("Running", "Succeeded", "Failed"):
                log = cluster.pod_log(namespace, p["metadata"]["name"], "node")
                seen[p["metadata"]["name"]] = json.dumps(p["status"])[-1500:] + "\n" + log[-2500:]
        tj = cluster.get_json(TRAINJOB, name, "-n", namespace)
        conds = conditions(tj)
        assert conds.get("Failed", {}).get("status") != "True", (tj.get("status"), seen)
        return tj if conds.get("Complete", {}).get("status") == "True" else None

    return complete


def test_a_trainjob_on_holmes_runtime_runs_on_holmes_plan_to_complete(
    cluster, holmes_runtime, namespace, tmp_path
):
    """The whole path with the operator running: a 2-node TrainJob on holmes-torchrun, pipeline
    2 x data 1, its script (from a ConfigMap the user mounts by a runtime patch) calling
    ``init_process_group()`` without a backend. The operator plans the JobSet Trainer renders,
    pins the two pods onto two islands (a stage each) and writes each pod's plan entry into the
    annotations the runtime's downwardAPI volume shows; the launcher runs torchrun at the plan's
    ranks; the TrainJob is Complete. Failed before the runtime had a plan volume (its pods
    waited for a plan.json that was never there)."""
    install_crd(cluster.kubeconfig)
    name = "holmes-pair"
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log").start()
    try:
        apply(cluster, holmes_trainjob(cluster, namespace, name, pipeline=2, data=1))
        wait_for("the TrainJob Complete on Holmes' plan", completion(cluster, namespace, name), 240, 1, op)
    finally:
        op.stop()
        print(op.tail(40))

    doc = jp.read_plan(cluster.get_json("configmap", jp.plan_name(name), "-n", namespace))
    assert (doc["pipeline"], doc["data"]) == (2, 1), doc
    islands = set()
    for p in pods_of(cluster, namespace, name):
        host = p["spec"]["hostname"]
        entry = doc["pods"][host]
        assert p["status"]["phase"] == "Succeeded", p["status"]
        assert p["spec"]["nodeName"] == entry["node"] == p["spec"]["nodeSelector"]["kubernetes.io/hostname"]
        own = json.loads(p["metadata"]["annotations"][jp.ANN_PLAN])  # what the pod read as plan.json
        assert own["pods"] == {host: entry}, own
        assert ISLANDS[entry["node"]] == entry["island"].replace("/", "."), entry  # its stage's island
        islands.add(ISLANDS[entry["node"]])
        log = cluster.pod_log(namespace, p["metadata"]["name"], "node")
        rank = entry["nodeRank"]
        assert f"rank {rank}/2 allreduce 3 backend " in log, log[-3000:]
    # both stages fit the fastest island (east's InfiniBand): the planner keeps them there
    assert islands == {"east.infiniband"}, islands


# Kueue's TrainJob integration (pkg/controller/jobs/trainjob), on beside its defaults here
TRAINJOB_INTEGRATIONS = {
    **INTEGRATIONS,
    "frameworks": [*INTEGRATIONS["frameworks"], "trainer.kubeflow.org/trainjob"],
}


def test_a_queued_trainjob_on_holmes_runtime_is_planned_inside_kueues_admission(
    cluster, holmes_runtime, real_kueue, namespace, tmp_path
):
    """Kueue queues the TrainJob and labels its Workload with the TrainJob's uid, not the
    JobSet's; Holmes finds that Workload through the JobSet's owner, waits for its admission and
    plans inside the admitted flavor (west's nodes; without Kueue it would pick east's
    InfiniBand). Before, Holmes looked for a Workload of the JobSet's own uid and waited for ever
    ("Kueue has made no Workload for this JobSet yet")."""
    real_kueue.up(log=lambda m: print(f"[kueue] {m}"), integrations=TRAINJOB_INTEGRATIONS)
    install_crd(cluster.kubeconfig)
    objs = west_flavor_queue(namespace)
    lq = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "LocalQueue",
        "metadata": {"name": "user-queue", "namespace": namespace},
        "spec": {"clusterQueue": f"cq-{namespace}"},
    }
    apply(cluster, {"apiVersion": "v1", "kind": "List", "items": [*objs, lq]})
    name = "queued-pair"
    tj = holmes_trainjob(cluster, namespace, name, pipeline=1, data=2)
    tj["metadata"]["labels"] = {LABEL_KUEUE_QUEUE: "user-queue"}
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log").start()
    try:
        apply(cluster, tj)
        wait_for("the queued TrainJob Complete", completion(cluster, namespace, name), 240, 1, op)
    finally:
        op.stop()
        print(op.tail(60))
    uid = cluster.get_json(TRAINJOB, name, "-n", namespace)["metadata"]["uid"]
    (wl,) = cluster.get_json(
        "workloads.kueue.x-k8s.io", "-n", namespace, "-l", f"kueue.x-k8s.io/job-uid={uid}"
    )["items"]
    flavors = [a["flavors"] for a in wl["status"]["admission"]["podSetAssignments"]]
    assert flavors == [{"cpu": f"west-{namespace}", "memory": f"west-{namespace}"}], flavors
    doc = jp.read_plan(cluster.get_json("configmap", jp.plan_name(name), "-n", namespace))
    assert (doc["pipeline"], doc["data"]) == (1, 2), doc
    pods = pods_of(cluster, namespace, name)
    assert len(pods) == 2
    assert_pinned_inside_west(pods, doc)
    js = cluster.get_json(JOBSET, name, "-n", namespace)
    assert jobset_status.current(js)["state"] == "Planned", js["metadata"].get("annotations")
    cluster.kubectl("delete", TRAINJOB, name, "-n", namespace, "--timeout=60s", check=False)
    delete_kueue_objects(cluster, namespace, [*objs, lq])
