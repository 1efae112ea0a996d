"""Issue 50, items 5-7, on the real local control plane (kube-apiserver 1.37.2, whose Pod Security
Admission is the real one): namespaces labelled pod-security.kubernetes.io/enforce=baseline and
=restricted, one operator serving both.

- Every Pod Security control's failing template (tests/helpers/operator/pss_cases.py) is refused
  by the API server's dry run before any pod exists: Stalled, reason TemplateRejected, with Pod
  Security's own message (Holmes no longer checks the standards itself).
- A misspelt template field (``nodeSelectr``, ``volumeMount``) is refused naming the job's field;
  a GPU limit other than gpusPerNode is refused naming it; no pod, ConfigMap or Service.
- Compliant jobs run: an RDMA job (InfiniBand nodes, the rdma/ resource, no IPC_LOCK) in the
  baseline namespace, its pods seeing the runtime's memlock limit (unlimited), and a job with
  an init container in the restricted namespace (the defaults Holmes fills in where the label
  says restricted).
- What Holmes renders from each control's passing template, every kind of its pods and the
  chart's own pods, dry-run on the real API server: admitted at their level (the labeller's
  DaemonSet needs privileged, for its hostPath volumes).
"""

from __future__ import annotations

import copy
import json
import resource
import uuid

import pytest
from holmes_dev.jobs import tiny_job

from holmes.operator.core.render import RenderSettings
from holmes.operator.preview import children
from localkube.operatorproc import OperatorProcess, install_crd
from tests.helpers.operator.cluster_helpers import SLEEP, wait_for
from tests.helpers.operator.pss_cases import BASELINE, CASES, RESTRICTED, c

pytestmark = pytest.mark.timeout(420)

ENFORCE = "pod-security.kubernetes.io/enforce"
IB_NODES = {
    "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["ib-0", "ib-1"]}]
}


@pytest.fixture(scope="module")
def levels(cluster, tmp_path_factory):
    """{level: namespace enforcing it} and the operator serving them."""
    install_crd(cluster.kubeconfig)
    out = {}
    for level in (BASELINE, RESTRICTED):
        ns = f"t-{level[:4]}-{uuid.uuid4().hex[:6]}"
        cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("label", "namespace", ns, f"{ENFORCE}={level}")
        out[level] = ns
    op = OperatorProcess(
        cluster.kubeconfig, list(out.values()), tmp_path_factory.mktemp("op") / "operator.log"
    ).start()
    yield out, op
    op.stop()
    print(op.tail(60))
    for ns in out.values():
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def jobs_in(cluster, ns) -> dict[str, dict]:
    return {j["metadata"]["name"]: j for j in cluster.get_json("holmesjobs", "-n", ns)["items"]}


def stalled(job: dict | None) -> dict | None:
    for cond in ((job or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == "Stalled" and cond["status"] == "True":
            return cond
    return None


def children_of(cluster, ns, names) -> list[str]:
    """The pods, ConfigMaps and Services of these jobs."""
    found = []
    for kind in ("pods", "configmaps", "services"):
        for o in cluster.get_json(kind, "-n", ns, "-l", "holmes.dev/job-name")["items"]:
            if o["metadata"]["labels"]["holmes.dev/job-name"] in names:
                found.append(f"{kind}/{o['metadata']['name']}")
    return found


def wait_stalled(cluster, op, where: dict[str, str], timeout=180) -> dict[str, dict]:
    """{job name: its Stalled condition} once every job (name -> namespace) has stalled."""

    def all_stalled():
        jobs = {}
        for ns in set(where.values()):
            jobs.update(jobs_in(cluster, ns))
        conds = {n: stalled(jobs.get(n)) for n in where}
        return None if any(v is None for v in conds.values()) else conds

    return wait_for("every job stalled", all_stalled, timeout=timeout, op=op)


INVALID_FIRST = {
    "procMount:spec.containers[0].securityContext.procMount",
    "seccompProfile_baseline:metadata.annotations['seccomp.security.alpha.kubernetes.io/pod']",
}


def test_each_control_is_refused_by_pod_security_admission_before_any_pod(cluster, levels):
    """Item 7: Holmes' copy of the Pod Security Standards is gone; the API server's Pod Security
    Admission refuses each control's failing template on the dry run, with its own message."""
    nss, op = levels
    where, items = {}, []
    for i, case in enumerate(CASES):
        name = f"pss-{i}"
        where[name] = nss[case.level]
        items.append(tiny_job(name, nss[case.level], count=1, template=copy.deepcopy(case.fail)))
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )
    conds = wait_stalled(cluster, op, where)
    by_psa, invalid, wrong = [], [], []
    for i, case in enumerate(CASES):
        cond = conds[f"pss-{i}"]
        if cond["reason"] != "TemplateRejected":
            wrong.append((case.id, cond))
        elif f'violates PodSecurity "{case.level}:' in cond["message"]:
            by_psa.append(case.id)
        elif "is invalid" in cond["message"]:  # the Pod's own validation comes first there
            invalid.append((case.id, cond["message"][:300]))
        else:
            wrong.append((case.id, cond))
    print(f"refused by Pod Security Admission: {len(by_psa)}, by Pod validation: {len(invalid)} {invalid}")
    assert not wrong, wrong
    # Pod validation refuses these before admission: Unmasked /proc needs hostUsers: false; the
    # old seccomp annotation must match the field (Holmes sets RuntimeDefault)
    assert {i for i, _ in invalid} == INVALID_FIRST, invalid
    assert len(by_psa) == len(CASES) - len(INVALID_FIRST)
    for ns in nss.values():
        assert children_of(cluster, ns, set(where)) == []


def test_misspelt_fields_and_a_gpu_limit_that_disagrees_are_refused_naming_the_field(cluster, levels):
    """Item 6: the CRD keeps the template open; the API server's strict dry run names an unknown
    field, and a GPU limit other than gpusPerNode is refused naming it; nothing is created."""
    nss, op = levels
    ns = nss[BASELINE]
    mount = {"name": "ckpt", "mountPath": "/ckpt"}
    jobs = {
        "selectr": {"spec": {"nodeSelectr": {"pool": "a"}}},
        "mount": {
            "spec": {
                "volumes": [{"name": "ckpt", "emptyDir": {}}],
                "containers": [{"name": "trainer", "volumeMount": [mount]}],
            }
        },
        "gpus": c(resources={"limits": {"nvidia.com/gpu": 1}}),
    }
    items = [tiny_job(n, ns, count=1, gpus=2, template=t) for n, t in jobs.items()]
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )
    conds = wait_stalled(cluster, op, {n: ns for n in jobs})
    assert conds["selectr"]["reason"] == "TemplateRejected", conds["selectr"]
    assert 'unknown field "spec.template.spec.nodeSelectr"' in conds["selectr"]["message"]
    assert conds["mount"]["reason"] == "TemplateRejected", conds["mount"]
    assert 'unknown field "spec.template.spec.containers[0].volumeMount"' in conds["mount"]["message"]
    assert conds["gpus"]["reason"] == "InvalidSpec", conds["gpus"]
    assert "spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]: 1" in conds["gpus"]["message"]
    assert "spec.nodes.gpusPerNode: 2" in conds["gpus"]["message"]
    assert children_of(cluster, ns, set(jobs)) == []


def test_compliant_jobs_run_rdma_in_baseline_with_the_runtimes_memlock(cluster, levels):
    """Item 5's done-when: an RDMA job runs in a namespace enforcing baseline (no IPC_LOCK), its
    pods seeing the memlock limit the runtime sets; a job with an init container runs under
    restricted."""
    nss, op = levels
    # the testbed's runtime (the node agent) gives unlimited, or its own hard limit where it may
    # not raise it (this machine runs it without CAP_SYS_RESOURCE): the limit is the runtime's
    hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
    runtime_hard = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    probe = ["sh", "-c", "grep 'Max locked memory' /proc/self/limits; sleep 600"]
    rdma = tiny_job("rdma", nss[BASELINE], count=2, command=probe)
    rdma["spec"]["nodes"]["selector"] = IB_NODES
    restricted = tiny_job(
        "restricted",
        nss[RESTRICTED],
        count=1,
        template={
            "spec": {
                # an image every node has
                "initContainers": [{"name": "fetch", "image": cluster.trainer_image, "command": ["true"]}],
                "containers": [{"name": "trainer", "command": SLEEP}],  # the agent runs one per pod
            }
        },
    )
    cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [rdma, restricted]}),
    )

    def running(ns, name, count):
        pods = cluster.get_json("pods", "-n", ns, "-l", f"holmes.dev/job-name={name}")["items"]
        ok = len(pods) == count and all(p.get("status", {}).get("phase") == "Running" for p in pods)
        return pods if ok else None

    pods = wait_for(
        "the RDMA job's pods running", lambda: running(nss[BASELINE], "rdma", 2), timeout=180, op=op
    )
    for pod in pods:
        trainer = pod["spec"]["containers"][0]
        assert pod["spec"]["nodeName"] in ("ib-0", "ib-1")
        assert any(k.startswith("rdma/") for k in trainer["resources"]["limits"]), trainer
        assert trainer["securityContext"]["capabilities"] == {"drop": ["ALL"]}, trainer
        env = {e["name"]: e.get("value") for e in trainer["env"]}
        assert env["NCCL_IB_DISABLE"] == "0"
        log = wait_for(
            "the pod's memlock line",
            lambda p=pod: (lambda t: t if "Max locked memory" in t else None)(
                cluster.pod_log(nss[BASELINE], p["metadata"]["name"], "trainer")
            ),
            timeout=60,
        )
        line = next(x for x in log.splitlines() if x.startswith("Max locked memory"))
        print(pod["metadata"]["name"], line, "(the node agent's own hard limit:", runtime_hard, ")")
        assert line.split()[3:5] == [runtime_hard, runtime_hard], line
    (pod,) = wait_for(
        "the restricted job's pod running",
        lambda: running(nss[RESTRICTED], "restricted", 1),
        timeout=180,
        op=op,
    )
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True  # the namespace's label says restricted
    for k in ("initContainers", "containers"):
        for cont in pod["spec"][k]:
            assert cont["securityContext"]["allowPrivilegeEscalation"] is False, cont


def dry_run(cluster, ns: str, pods: list[dict]) -> list[str]:
    """The API server's refusals of a server-side dry run of each pod ([] when all pass)."""
    out = []
    for pod in pods:
        pod = copy.deepcopy(pod)
        pod["metadata"]["namespace"] = ns
        r = cluster.kubectl(
            "create", "--dry-run=server", "--validate=strict", "-f", "-", input=json.dumps(pod), check=False
        )
        if r.returncode != 0:
            out.append(r.stderr.strip())
    return out


def rendered(cluster, level: str, template: dict | None, **spec) -> list[dict]:
    nodes = cluster.get_json("nodes")["items"]
    job = tiny_job("render", count=4, **({"template": template} if template else {}), **spec)
    objs = children(job, nodes, RenderSettings(pod_security=level))
    return [o for o in objs if o["kind"] == "Pod"]


SIDECARS = {
    "spec": {
        "initContainers": [{"name": "fetch", "image": "busybox"}],
        "containers": [{"name": "trainer"}, {"name": "sidecar", "image": "busybox"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
    }
}
VOLCANO = {
    "metadata": {"annotations": {"scheduling.volcano.sh/queue-name": "q"}},
    "spec": {"schedulerName": "volcano"},
}
# an external framework's pods: the user's image under Holmes' launcher (its init container)
LAUNCHER = {"spec": {"containers": [{"name": "trainer", "image": "reg/x:1", "command": ["python", "t.py"]}]}}


def test_what_holmes_renders_passes_the_namespaces_level_on_the_real_api_server(cluster, levels):
    """Every kind of pod Holmes renders (RDMA and Ethernet nodes, user init and sidecar
    containers, a framework's launcher, each control's passing template), rendered for a
    namespace's level, is admitted
    there by the API server's dry run; host-network pods need privileged."""
    nss, _ = levels
    for level in (BASELINE, RESTRICTED):
        for template, spec in (
            (None, {}),
            (SIDECARS, {}),
            (VOLCANO, {}),
            (LAUNCHER, {"framework": "torchrun"}),
        ):
            pods = rendered(cluster, level, template, **spec)
            assert {p["metadata"]["labels"]["holmes.dev/nic"] for p in pods} >= {"infiniband", "ethernet"}
            assert dry_run(cluster, nss[level], pods) == [], (level, template)
    passing = {
        f"{i}:{case.id}": dry_run(cluster, nss[case.level], rendered(cluster, case.level, case.ok)[:1])
        for i, case in enumerate(CASES)
    }
    refused = {k: v for k, v in passing.items() if v}
    print(f"passing templates admitted: {len(passing) - len(refused)} of {len(passing)}")
    assert not refused, refused
    host = rendered(cluster, BASELINE, None, network="hostNetwork")
    errors = dry_run(cluster, nss[BASELINE], host)
    assert host and len(errors) == len(host), errors
    assert all("violates PodSecurity" in e and "host namespaces" in e for e in errors), errors


def test_the_charts_own_pods_on_the_real_api_server(cluster, levels):
    """The operator's pod passes restricted; the labeller's needs privileged (its hostPath
    volumes), as docs/install.md says."""
    from tests.helpers.packaging.packaging_helpers import one, render

    nss, _ = levels

    def as_pod(template: dict, name: str) -> dict:
        spec = dict(template["spec"], serviceAccountName="default")  # the chart's account is not here
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}

    operator = one(render(), "Deployment")["spec"]["template"]
    assert dry_run(cluster, nss[RESTRICTED], [as_pod(operator, "operator")]) == []
    labeller = one(render({"labeller.enabled": "true"}), "DaemonSet")["spec"]["template"]
    (refused,) = dry_run(cluster, nss[BASELINE], [as_pod(labeller, "labeller")])
    assert "violates PodSecurity" in refused and "hostPath" in refused, refused


def test_holmes_plan_pods_asks_the_api_server_with_a_kubeconfig(cluster, levels, tmp_path, capsys):
    """Item 6, offline vs live: with --kubeconfig, holmes plan --pods dry-runs the pods it renders
    in the job's namespace and exits 2 naming the misspelt field; a good job exits 0."""
    from holmes.cli import main

    nss, _ = levels
    for name, template, code in (("bad", {"spec": {"nodeSelectr": {"a": "b"}}}, 2), ("good", None, 0)):
        job = tmp_path / f"{name}.json"
        extra = {"template": template} if template else {}
        job.write_text(json.dumps(tiny_job(name, nss[BASELINE], count=2, **extra)))
        got = main(["plan", "--kubeconfig", cluster.kubeconfig, "--job", str(job), "--pods", "--json"])
        err = capsys.readouterr().err
        assert got == code, err
        if code:
            assert 'unknown field "spec.template.spec.nodeSelectr"' in err, err
        else:
            assert "the API server accepted a dry run" in err, err
