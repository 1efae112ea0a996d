"""A HolmesJob dispatched by Kueue's MultiKueue, end to end (issue 51): two control planes (the
``member_clusters`` fixture: east the manager, west the worker), the real Kueue v0.17.1 on each
(the manager's configured as a MultiKueue manager for HolmesJobs: ``multiKueue.externalFrameworks``,
a MultiKueueCluster reaching the worker through a kubeconfig Secret in Kueue's namespace, a
MultiKueueConfig, an AdmissionCheck of ``kueue.x-k8s.io/multikueue`` on its ClusterQueue), and
Holmes' operator on both. A job with ``managedBy: kueue.x-k8s.io/multikueue`` in the manager's
LocalQueue: the manager's operator creates its Workload only, MultiKueue copies it and the job to
the worker, the worker's operator runs the copy with that Workload (owned, its spec untouched) to
Succeeded, and MultiKueue copies the status back: the manager's job shows Succeeded and its pods
ran on the worker only. The rules themselves: tests/unit/operator/test_multikueue.py."""

from __future__ import annotations

import json
import sys
import uuid

import pytest
from holmes_dev.jobs import tiny_job

from holmes.contract.names import MANAGED_BY_MULTIKUEUE
from holmes.operator.core import queueing
from localkube.operatorproc import CRD, OperatorProcess
from tests.e2e.conftest import KUEUE_STANDIN_CRDS
from tests.helpers import polling
from tests.helpers.operator.kueue_real import kueue_objects, queued

pytestmark = pytest.mark.timeout(420)

KUEUE_NS = "kueue-system"
SECRET = "holmes-worker-kubeconfig"
ESTABLISHED = "jsonpath={.status.conditions[?(@.type=='Established')].status}"


def objs_json(objs: list[dict]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})


def multikueue_objects(cq: str, worker: str) -> list[dict]:
    """The manager's MultiKueue: the worker cluster, the config listing it, the admission check."""
    api = "kueue.x-k8s.io/v1beta2"
    return [
        {
            "apiVersion": api,
            "kind": "MultiKueueCluster",
            "metadata": {"name": worker},
            "spec": {"clusterSource": {"kubeConfig": {"locationType": "Secret", "location": SECRET}}},
        },
        {
            "apiVersion": api,
            "kind": "MultiKueueConfig",
            "metadata": {"name": f"mk-{cq}"},
            "spec": {"clusters": [worker]},
        },
        {
            "apiVersion": api,
            "kind": "AdmissionCheck",
            "metadata": {"name": f"mk-{cq}"},
            "spec": {
                "controllerName": "kueue.x-k8s.io/multikueue",
                "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": f"mk-{cq}"},
            },
        },
    ]


@pytest.fixture(scope="module")
def planes(member_clusters):
    from localkube.kueue import HOLMESJOB, Kueue

    mc = member_clusters
    manager, worker = mc.hub, next(m for m in mc.members if m != mc.hub)
    kueues = {}
    for m in (manager, worker):
        mc.kubectl(m, "apply", "-f", str(CRD))
        polling.wait_for(
            f"the HolmesJob CRD on {m}",
            lambda m=m: (
                mc.kubectl(m, "get", "crd/holmesjobs.holmes.dev", "-o", ESTABLISHED, check=False) == "True"
            ),
            60,
            0.3,
        )
        for crd in KUEUE_STANDIN_CRDS:  # the stand-ins (hack/thirdparty-crds) are not Kueue's
            label = "jsonpath={.metadata.labels.app\\.kubernetes\\.io/name}"
            found = mc.kubectl(m, "get", "crd", crd, "-o", label, "--ignore-not-found", check=False)
            if found.strip() != "kueue" and mc.kubectl(
                m, "get", "crd", crd, "--ignore-not-found", check=False
            ):
                mc.kubectl(m, "delete", "crd", crd, "--wait=true", "--timeout=60s")
        kq = kueues[m] = Kueue(mc.plane(m))
        # MultiKueue watches every integration's kind on the worker: none whose CRD it lacks (JobSet)
        integrations = {"frameworks": ["batch/job"], "externalFrameworks": [HOLMESJOB]}
        say = lambda s, m=m: print(f"[kueue {m}] {s}", file=sys.stderr)  # noqa: E731
        kq.up(log=say, integrations=integrations, multikueue=m == manager)
    try:
        yield mc, manager, worker
    finally:
        for kq in kueues.values():  # other modules use these clusters without Kueue
            kq.uninstall()


@pytest.fixture
def ns(planes):
    mc, manager, worker = planes
    name = f"mk-{uuid.uuid4().hex[:8]}"
    mc.ensure_namespace(name)
    yield name
    for m in mc.members:
        mc.kubectl(m, "delete", "holmesjob", "--all", "-n", name, "--wait=false", check=False)
        mc.kubectl(m, "delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def operators(planes, ns, tmp_path):
    mc, manager, worker = planes
    ops = {
        m: OperatorProcess(
            str(mc.kubeconfig(m)), [ns], tmp_path / f"operator-{m}.log", extra=["--progress-interval=1"]
        ).start()
        for m in (manager, worker)
    }
    yield ops
    for m, op in ops.items():
        op.stop()
        print(f"--- operator on {m}\n{op.tail(60)}")


def get(mc, member, *args):
    out = mc.kubectl(member, "get", *args, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def test_a_holmesjob_multikueue_dispatches_runs_on_the_worker_and_its_status_comes_back(
    planes, ns, operators
):
    mc, manager, worker = planes
    queue_objs = kueue_objects(ns, 4)[:3]  # a flavor, a ClusterQueue of 4 GPUs, the LocalQueue
    mc.kubectl(worker, "apply", "-f", "-", input=objs_json(queue_objs))
    cq = queue_objs[1]["metadata"]["name"]
    kubeconfig = mc.kubeconfig(worker).read_text()
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": KUEUE_NS},
        "stringData": {"kubeconfig": kubeconfig},
    }
    manager_queue = [dict(o) for o in queue_objs]
    manager_queue[1] = json.loads(json.dumps(queue_objs[1]))
    manager_queue[1]["spec"]["admissionChecksStrategy"] = {"admissionChecks": [{"name": f"mk-{cq}"}]}
    mc.kubectl(
        manager,
        "apply",
        "-f",
        "-",
        input=objs_json([secret, *multikueue_objects(cq, worker), *manager_queue]),
    )

    def active(kind, name):
        obj = get(mc, manager, kind, name) or {}
        return any(
            c.get("type") == "Active" and c.get("status") == "True"
            for c in (obj.get("status") or {}).get("conditions") or []
        )

    kueue_log = mc.plane(manager).dir / "logs" / "kueue.log"

    def why() -> str:
        status = (get(mc, manager, "multikueuecluster", worker) or {}).get("status")
        lines = [ln for ln in kueue_log.read_text(errors="replace").splitlines() if "ulti" in ln]
        return f"\nstatus: {json.dumps(status)}\nkueue log:\n" + "\n".join(lines[-25:])

    polling.wait_for(
        "the MultiKueueCluster Active", lambda: active("multikueuecluster", worker), 90, 0.5, detail=why
    )

    job = queued(tiny_job("mk", ns, count=2, gpus=1, command=["sleep", "2"]))
    job["spec"]["managedBy"] = MANAGED_BY_MULTIKUEUE
    mc.kubectl(manager, "apply", "-f", "-", input=json.dumps(job))

    seen: dict = {}

    def worker_done() -> bool:
        """The worker's copy Succeeded, with its Workload and pods as they are then (MultiKueue
        deletes them once the manager's Workload is finished)."""
        copy = get(mc, worker, "holmesjob", "mk", "-n", ns)
        if not copy or (copy.get("status") or {}).get("phase") != "Succeeded":
            return False
        name = copy["metadata"]["labels"]["kueue.x-k8s.io/prebuilt-workload-name"]
        seen["job"], seen["workload"] = copy, get(mc, worker, "workloads.kueue.x-k8s.io", name, "-n", ns)
        seen["pods"] = (get(mc, worker, "pods", "-n", ns, "-l", "holmes.dev/job-name=mk") or {}).get("items")
        return True

    def manager_phase():
        return ((get(mc, manager, "holmesjob", "mk", "-n", ns) or {}).get("status") or {}).get("phase")

    detail = lambda: "\n".join(f"--- {m}\n{o.tail(40)}" for m, o in operators.items())  # noqa: E731
    polling.wait_for("the worker's copy Succeeded", worker_done, 180, 1, detail=detail)
    polling.wait_for(
        "the manager's job Succeeded (copied)", lambda: manager_phase() == "Succeeded", 60, 1, detail=detail
    )
    copy, wl = seen["job"], seen["workload"]
    assert "managedBy" not in copy["spec"]
    assert len(seen["pods"]) == 2 and all(p["status"]["phase"] == "Succeeded" for p in seen["pods"])
    if wl is not None:  # not yet deleted by MultiKueue when the copy Succeeded
        (owner,) = [r for r in wl["metadata"].get("ownerReferences") or [] if r.get("controller")]
        assert owner["uid"] == copy["metadata"]["uid"]
        mine = get(mc, manager, "workloads.kueue.x-k8s.io", wl["metadata"]["name"], "-n", ns)
        # the worker never rewrote them (MultiKueue's Go client writes an empty template metadata)
        assert queueing.same_pod_sets(mine["spec"]["podSets"], wl["spec"]["podSets"])
        assert [p["count"] for p in wl["spec"]["podSets"]] == [2]
    on_manager = (get(mc, manager, "pods", "-n", ns, "-l", "holmes.dev/job-name=mk") or {}).get("items")
    assert not on_manager, "pods ran on the manager"
