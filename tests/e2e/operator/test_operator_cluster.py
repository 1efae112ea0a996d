"""The operator against the real local control plane: manifests applied with kubectl, the
operator running as a subprocess (killed and restarted where the test says so), pods run by
the node agent as local processes."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from holmes_dev.jobs import tiny_job

from holmes.operator.leader import LeaseConfig
from localkube.operatorproc import OperatorProcess, fake_gpu_node
from tests.helpers.operator.cluster_helpers import (
    SLEEP,
    apply,
    condition,
    events_of,
    get_job,
    pods_of,
    register_hollow,
    running_operator,
    wait_for,
    wait_phase,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def operator(crd, namespace, tmp_path):
    # A 1 s restart back-off: the path is exercised, the gang-restart tests stay fast.
    backoff = ["--restart-backoff-seconds=1", "--restart-backoff-max-seconds=2"]
    yield from running_operator(crd, namespace, tmp_path, extra=backoff)


def wait_reconciling(cluster, ns, name, reason, op):
    """The job once its Reconciling condition has this reason."""

    def check():
        job = get_job(cluster, ns, name)
        c = condition(job, "Reconciling") if job and job.get("status") else {}
        return job if c.get("reason") == reason else None

    return wait_for(f"{name} Reconciling {reason}", check, op=op)


def env_of(pod):
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


# ---- the API ------------------------------------------------------------------------------------


@pytest.mark.compat
def test_crd_installs_and_kubectl_explain_teaches_the_fields(crd):
    # The API server publishes a new CRD's OpenAPI schema a few seconds after it is Established.
    out = wait_for(
        "the schema in OpenAPI",
        lambda: (lambda r: r.stdout if r.returncode == 0 else None)(
            crd.kubectl("explain", "holmesjob.spec.parallelism", check=False)
        ),
        timeout=60,
        every=1,
    )
    assert "nicSelection" in out and "same NIC kind" in out and "partition" in out
    out = crd.kubectl("explain", "hj.spec.runPolicy.backoffLimit").stdout
    assert "Gang restarts allowed" in out
    out = crd.kubectl("explain", "holmesjob.status.conditions").stdout
    assert "Stalled" in out
    out = crd.kubectl("explain", "hj.spec.model.architecture").stdout
    assert "llama" in out and "grouped-query attention" in out
    out = crd.kubectl("explain", "hj.spec.model.init.huggingface").stdout
    assert "save_pretrained" in out


def test_the_schema_rejects_what_it_can(crd, namespace):
    bad = tiny_job("bad-enum", namespace, parallelism={"nicSelection": "sometimes"})
    r = apply(crd, bad, check=False)
    assert r.returncode != 0 and "nicSelection" in r.stderr and "sometimes" in r.stderr
    bad = tiny_job("bad-count", namespace, count=0)
    r = apply(crd, bad, check=False)
    assert r.returncode != 0 and "spec.nodes.count" in r.stderr
    bad = tiny_job("bad-missing", namespace)
    del bad["spec"]["model"]
    r = apply(crd, bad, check=False)
    assert r.returncode != 0 and "spec.model: Required value" in r.stderr, r.stderr


# ---- placement, env, status ---------------------------------------------------------------------


@pytest.mark.compat
def test_pods_land_on_the_planned_nodes_with_the_nccl_env_of_their_nic(crd, namespace, operator):
    apply(
        crd,
        tiny_job(
            "place",
            namespace,
            count=6,
            command=SLEEP,
            training={"globalBatchSize": 12, "microBatchSize": 1, "iterations": 5, "learningRate": 1.0e-3},
        ),
    )
    job = wait_phase(crd, namespace, "place", "Running", op=operator)
    truth = {n.name: n.nic for n in crd.topology.nodes}
    layout = json.loads(crd.get_json("configmap", "place-layout", "-n", namespace)["data"]["layout.json"])
    pods = {p["metadata"]["name"]: p for p in pods_of(crd, namespace, "place")}
    assert len(pods) == 6
    for rank, node in enumerate(layout["nodes"]):
        pod = pods[f"place-1-{rank}"]
        assert pod["spec"]["nodeName"] == node, "the scheduler bound the pod where the layout put it"
        env = env_of(pod)
        assert env["NODE_RANK"] == str(rank) and env["HOLMES_NIC"] == truth[node]
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        if truth[node] == "ethernet":
            assert env["NCCL_IB_DISABLE"] == "1" and not any(k.startswith("rdma/") for k in limits)
        else:
            assert env["NCCL_IB_DISABLE"] == "0" and any(k.startswith("rdma/") for k in limits)
            assert "add" not in pod["spec"]["containers"][0]["securityContext"]["capabilities"]
        # host names stay out of pods (the in-pod launcher resolves them); NCCL picks the GID
        assert not {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX"} & set(env)
        assert env["HOLMES_POD_NETWORK"] == "podNetwork"
    st = job["status"]
    assert st["layout"]["worldSize"] == 6 and st["pods"]["running"] == 6
    for g in st["layout"]["dpGroups"]:
        nodes = st["layout"]["stages"][g["stage"]]["nodes"]
        assert len(g["nics"]) == 1 and {truth[n] for n in nodes} == set(g["nics"]), g
    assert condition(job, "Ready")["status"] == "True" and condition(job, "Reconciling")["status"] == "False"
    assert job["status"]["observedGeneration"] == job["metadata"]["generation"]
    reasons = {e["reason"] for e in events_of(crd, namespace, "place")}
    assert {"Planned", "Launched", "AllPodsRunning"} <= reasons, reasons
    printed = crd.kubectl("get", "hj", "place", "-n", namespace).stdout
    assert "Running" in printed and st["layout"]["shape"] in printed
    # The operator's own endpoints and structured (JSON) logs.
    assert f'holmes_jobs{{job_namespace="{namespace}",phase="Running"}} 1.0' in operator.metrics()
    assert f'holmes_pods_created_total{{job_namespace="{namespace}"}} 6.0' in operator.metrics()
    assert "holmes_leader 1.0" in operator.metrics()
    assert "Running" in operator.healthz()["jobs"]  # kopf caches probe results a while
    records = [
        json.loads(line) for line in operator.log_path.read_text().splitlines() if line.startswith("{")
    ]
    mine = [r for r in records if r.get("job") == f"{namespace}/place"]
    assert any(r.get("reason") == "Launched" and r.get("attempt") == 1 for r in mine), records[-5:]


@pytest.mark.compat
def test_trainer_pods_run_for_real_and_the_job_succeeds_with_progress(crd, namespace, operator):
    apply(crd, tiny_job("train", namespace, count=4, iterations=6))
    job = wait_phase(crd, namespace, "train", "Succeeded", timeout=180, op=operator)
    st = job["status"]
    prog = st.get("progress") or {}
    # The last numbers come from the trainer's final JSON line (rank-0 log tail).
    assert prog.get("iteration") == 6 and prog.get("loss", 0) > 0 and prog.get("tflopsPerGpu", 0) > 0, st
    assert st["completionTime"] and st["restarts"] == 0 and st["pods"]["succeeded"] == 4
    assert condition(job, "Succeeded")["status"] == "True"
    log = crd.pod_log(namespace, "train-1-0", "trainer")
    assert '"holmes": "done"' in log


# ---- failures and lifecycle ---------------------------------------------------------------------


def test_a_pod_failure_restarts_the_gang_and_counts_it(crd, namespace, operator):
    fail_once = [
        "sh",
        "-c",
        'if [ "$NODE_RANK" = 1 ] && [ "$HOLMES_ATTEMPT" = 1 ]; then sleep 2; exit 3; fi; sleep 600',
    ]
    apply(crd, tiny_job("gang", namespace, command=fail_once))
    job = wait_for(
        "a restart",
        lambda: (
            lambda j: (
                j
                if j and j.get("status", {}).get("restarts") == 1 and j["status"].get("phase") == "Running"
                else None
            )
        )(get_job(crd, namespace, "gang")),
        timeout=90,
        op=operator,
    )
    assert job["status"]["attempt"] == 2
    live = wait_for(
        "old attempt gone",
        lambda: (
            lambda ps: (
                ps
                if all(p["metadata"]["labels"]["holmes.dev/attempt"] == "2" for p in ps) and len(ps) == 4
                else None
            )
        )(pods_of(crd, namespace, "gang")),
        op=operator,
    )
    assert len(live) == 4
    warnings = [e for e in events_of(crd, namespace, "gang") if e["type"] == "Warning"]
    assert any(e["reason"] == "PodFailed" and "exit code 3" in e["message"] for e in warnings), warnings
    assert f'holmes_restarts_total{{job_namespace="{namespace}"}} 1.0' in operator.metrics()


def test_a_quota_that_forbids_the_gang_is_reported_and_creates_no_pod(crd, namespace, operator):
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus", "namespace": namespace},
        "spec": {"hard": {"requests.nvidia.com/gpu": "2"}},  # room for 2 of the 4 one-GPU pods
    }
    apply(crd, quota)
    wait_for(
        "the quota controller to fill in the quota's status",
        lambda: crd.get_json("resourcequota", "gpus", "-n", namespace).get("status", {}).get("hard"),
    )
    apply(crd, tiny_job("quota", namespace, command=SLEEP))

    # the quota is read before creating (issue 50): no pod is created for the API server to refuse
    job = wait_reconciling(crd, namespace, "quota", "WaitingForQuota", operator)
    msg = condition(job, "Reconciling")["message"]
    assert msg.startswith(
        "ResourceQuota gpus: the gang's 4 pod(s) need requests.nvidia.com/gpu 4, 0 of 2 used"
    )
    assert "more than the quota allows at all" in msg, msg
    assert "createFailures" not in job["status"] and job["status"]["restarts"] == 0
    assert not pods_of(crd, namespace, "quota")
    assert "ChildCreateFailed" not in {e["reason"] for e in events_of(crd, namespace, "quota")}
    crd.kubectl("delete", "resourcequota", "gpus", "-n", namespace)
    job = wait_phase(crd, namespace, "quota", "Running", op=operator)
    assert "createFailures" not in job["status"] and condition(job, "Stalled")["status"] == "False"


def test_backoff_limit_exhausted_fails_the_job_with_the_reason(crd, namespace, operator):
    always_fail = ["sh", "-c", 'if [ "$NODE_RANK" = 0 ]; then exit 7; fi; sleep 600']
    apply(crd, tiny_job("doomed", namespace, command=always_fail, run_policy={"backoffLimit": 1}))
    job = wait_phase(crd, namespace, "doomed", "Failed", op=operator)
    failed = condition(job, "Failed")
    assert failed["reason"] == "BackoffLimitExceeded" and "exit code 7" in failed["message"]
    assert job["status"]["restarts"] == 1 and job["status"]["completionTime"]
    assert (
        f'holmes_job_failures_total{{job_namespace="{namespace}",reason="BackoffLimitExceeded"}} 1.0'
        in operator.metrics()
    )
    wait_for(
        "no running pods",
        lambda: (
            not [
                p
                for p in pods_of(crd, namespace, "doomed")
                if p["status"].get("phase") in ("Pending", "Running")
                and not p["metadata"].get("deletionTimestamp")
            ]
            or None
        ),
        op=operator,
    )


def set_suspend(cluster, ns, name, suspend: bool):
    patch = json.dumps({"spec": {"runPolicy": {"suspend": suspend}}})
    cluster.kubectl("patch", "hj", name, "-n", ns, "--type=merge", "-p", patch)


def test_suspend_deletes_pods_and_resume_relaunches(crd, namespace, operator):
    apply(crd, tiny_job("pause", namespace, command=SLEEP))
    wait_phase(crd, namespace, "pause", "Running", op=operator)
    set_suspend(crd, namespace, "pause", True)
    job = wait_phase(crd, namespace, "pause", "Suspended", op=operator)
    assert condition(job, "Suspended")["status"] == "True"
    wait_for("pods deleted", lambda: not pods_of(crd, namespace, "pause") or None, op=operator)
    set_suspend(crd, namespace, "pause", False)
    job = wait_phase(crd, namespace, "pause", "Running", op=operator)
    assert job["status"]["restarts"] == 0 and job["status"]["attempt"] == 2
    assert {e["reason"] for e in events_of(crd, namespace, "pause")} >= {"Suspended", "Resumed"}


def test_spec_edits_relaunch_but_the_model_is_immutable(crd, namespace, operator):
    apply(crd, tiny_job("edit", namespace, command=SLEEP))
    wait_phase(crd, namespace, "edit", "Running", op=operator)
    crd.kubectl(
        "patch", "hj", "edit", "-n", namespace, "--type=merge", "-p", '{"spec":{"training":{"iterations":9}}}'
    )
    job = wait_for(
        "relaunch",
        lambda: (
            lambda j: j if j["status"].get("attempt") == 2 and j["status"].get("phase") == "Running" else None
        )(get_job(crd, namespace, "edit")),
        op=operator,
    )
    assert job["status"]["restarts"] == 0 and "SpecChanged" in {
        e["reason"] for e in events_of(crd, namespace, "edit")
    }
    assert "iterations: 9" in crd.get_json("configmap", "edit-layout", "-n", namespace)["data"]["job.yaml"]
    # the CRD's CEL rule refuses a model edit at once (the operator's own ImmutableField stall,
    # for a CRD applied without its rules, is tested in tests/unit/operator)
    r = crd.kubectl(
        "patch",
        "hj",
        "edit",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"model":{"layers":8}}}',
        check=False,
    )
    assert r.returncode != 0 and "model is immutable" in r.stderr, r.stderr
    job = get_job(crd, namespace, "edit")
    assert condition(job, "Stalled").get("status") != "True" and job["status"]["phase"] == "Running"
    assert (
        len([p for p in pods_of(crd, namespace, "edit") if not p["metadata"].get("deletionTimestamp")]) == 4
    )


def test_delete_garbage_collects_every_child(crd, namespace, operator):
    apply(crd, tiny_job("gone", namespace, command=SLEEP))
    job = wait_phase(crd, namespace, "gone", "Running", op=operator)
    uid = job["metadata"]["uid"]
    for kind in ("pods", "services", "configmaps"):
        owned = [o for o in crd.get_json(kind, "-n", namespace, "-l", "holmes.dev/job-name=gone")["items"]]
        assert owned and all(o["metadata"]["ownerReferences"][0]["uid"] == uid for o in owned), kind
    crd.kubectl("delete", "hj", "gone", "-n", namespace, "--wait=false")

    def children():
        left = sum(
            len(crd.get_json(k, "-n", namespace, "-l", "holmes.dev/job-name=gone")["items"])
            for k in ("pods", "services", "configmaps")
        )
        return left == 0 and get_job(crd, namespace, "gone") is None

    wait_for("children garbage-collected", children, timeout=120, every=1, op=operator)


def test_ttl_after_finished_deletes_the_job(crd, namespace, operator):
    apply(
        crd,
        tiny_job(
            "short",
            namespace,
            command=["sh", "-c", "exit 0"],
            run_policy={"backoffLimit": 0, "ttlSecondsAfterFinished": 2},
        ),
    )
    wait_phase(crd, namespace, "short", "Succeeded", op=operator)
    wait_for("ttl deletion", lambda: get_job(crd, namespace, "short") is None, timeout=60, op=operator)


def test_operator_killed_mid_reconcile_creates_no_duplicates(crd, namespace, tmp_path):
    op = OperatorProcess(crd.kubeconfig, [namespace], tmp_path / "op.log").start()
    try:
        apply(
            crd,
            tiny_job(
                "crash",
                namespace,
                count=6,
                command=SLEEP,
                training={
                    "globalBatchSize": 12,
                    "microBatchSize": 1,
                    "iterations": 5,
                    "learningRate": 1.0e-3,
                },
            ),
        )
        wait_for("the first pod", lambda: pods_of(crd, namespace, "crash") or None, every=0.02, op=op)
        op.kill()  # SIGKILL while it is creating pods
        created_before = len(pods_of(crd, namespace, "crash"))
        print(f"pods when the operator was killed: {created_before} of 6")
        op.start()
        job = wait_phase(crd, namespace, "crash", "Running", op=op)
    finally:
        op.stop()
        print(op.tail(60))
    pods = pods_of(crd, namespace, "crash")
    names_ = sorted(p["metadata"]["name"] for p in pods)
    assert names_ == [f"crash-1-{r}" for r in range(6)], (created_before, names_)
    assert all(p["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"] for p in pods)
    assert job["status"]["restarts"] == 0 and job["status"]["attempt"] == 1
    assert len(crd.get_json("services", "-n", namespace, "-l", "holmes.dev/job-name=crash")["items"]) == 1


@pytest.fixture
def fake_nodes(crd):
    """64 extra 8-GPU hollow nodes, played by the cluster's kwok."""
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes import client

    core = client.CoreV1Api(crd.api_client())
    nodes = [fake_gpu_node(i) for i in range(64)]
    register_hollow(crd, nodes)
    yield core
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(lambda n: core.delete_node(n["metadata"]["name"], _preload_content=False), nodes))


def test_operator_killed_while_creating_a_large_job_leaves_no_duplicates(
    crd, namespace, fake_nodes, tmp_path
):
    big = tiny_job(
        "big",
        namespace,
        count=64,
        gpus=8,
        command=SLEEP,
        model={"layers": 8, "hiddenSize": 64, "attentionHeads": 4, "seqLength": 32, "vocabSize": 128},
        training={"globalBatchSize": 1024, "microBatchSize": 1, "iterations": 5, "learningRate": 1.0e-3},
    )
    big["spec"]["nodes"]["selector"] = {"matchLabels": {"holmes.dev/fake": "1"}}
    big["spec"]["template"]["spec"]["tolerations"] = [{"key": "holmes.dev/fake", "operator": "Exists"}]
    op = OperatorProcess(crd.kubeconfig, [namespace], tmp_path / "op.log").start()
    try:
        time.sleep(1)  # the node index fills
        apply(crd, big)

        def count():
            r = fake_nodes.list_namespaced_pod(
                namespace, label_selector="holmes.dev/job-name=big", _preload_content=False
            )
            return len(json.loads(r.data)["items"])

        wait_for("pods being created", lambda: count() >= 4 or None, every=0.005, op=op)
        op.kill()  # SIGKILL in the middle of creating 64 pods
        at_kill = count()
        print(f"pods when the operator was killed: {at_kill} of 64")
        op.start()
        job = wait_for(
            "launched",
            lambda: (
                lambda j: (
                    j
                    if j.get("status", {}).get("launched") and len(pods_of(crd, namespace, "big")) == 64
                    else None
                )
            )(get_job(crd, namespace, "big")),
            timeout=120,
            op=op,
        )
        time.sleep(2)  # a few more reconciles: still nothing extra
        pods = pods_of(crd, namespace, "big")
    finally:
        op.stop()
        # at once: the test's end need not wait for 64 graceful deletions
        fake_nodes.delete_collection_namespaced_pod(namespace, grace_period_seconds=0, _preload_content=False)
    assert sorted(p["metadata"]["name"] for p in pods) == sorted(f"big-1-{r}" for r in range(64))
    assert all(p["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"] for p in pods)
    assert job["status"]["attempt"] == 1 and job["status"]["restarts"] == 0
    layout = json.loads(crd.get_json("configmap", "big-layout", "-n", namespace)["data"]["layout.json"])
    placed = {
        p["metadata"]["name"]: p["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0]
        for p in pods
    }
    assert [placed[f"big-1-{r}"] for r in range(64)] == layout["nodes"]


def test_bad_manifests_each_get_a_clear_message_and_the_operator_keeps_serving(crd, namespace, operator):
    bad = {
        "bad-heads": (
            dict(
                model={"layers": 4, "hiddenSize": 66, "attentionHeads": 4, "seqLength": 32, "vocabSize": 128}
            ),
            "InvalidSpec",
            "spec.model.hiddenSize",
        ),
        "bad-partition": (
            dict(parallelism={"partition": [1, 2]}),
            "InvalidSpec",
            "spec.parallelism.partition",
        ),
        "bad-pipeline": (dict(parallelism={"pipeline": "two"}), "InvalidSpec", "spec.parallelism.pipeline"),
        "bad-batch": (
            dict(
                training={"globalBatchSize": 7, "microBatchSize": 2, "iterations": 5, "learningRate": 1.0e-3}
            ),
            "InvalidSpec",
            "spec.training.globalBatchSize",
        ),
        "bad-fit": (dict(parallelism={"pipeline": 3, "data": 1}), "InvalidSpec", "spec.parallelism"),
        "bad-tensor": (  # a tensor degree the trainer could not split: refused before any pod
            dict(
                model={"layers": 4, "hiddenSize": 64, "attentionHeads": 4, "seqLength": 32, "vocabSize": 129},
                parallelism={"tensor": 2},
                nodes={"count": 2, "gpusPerNode": 2},
            ),
            "InvalidSpec",
            "2 must divide model.vocabSize 129",
        ),
        "x" * 51: ({}, "InvalidName", "metadata.name"),
    }
    # the CRD's CEL rules refuse what they can at apply time, naming the field (a name longer
    # than its pods' hostnames leave room for, too); the rest is admitted and stalled by the
    # operator, which checks all of it (a CRD without its rules)
    stalls = {}
    for name, (spec, reason, field) in bad.items():
        r = apply(crd, tiny_job(name, namespace, command=SLEEP, **spec), check=False)
        if r.returncode != 0:
            assert "is invalid" in r.stderr and ("spec" in r.stderr or field in r.stderr), r.stderr
        else:
            stalls[name] = (spec, reason, field)
    assert len(stalls) < len(bad) and "x" * 51 not in stalls, sorted(stalls)
    apply(crd, tiny_job("good", namespace, command=SLEEP))
    wait_phase(crd, namespace, "good", "Running", op=operator)
    for name, (_, reason, field) in stalls.items():

        def stalled(name=name):
            job = get_job(crd, namespace, name)
            c = condition(job, "Stalled") if job and job.get("status") else {}
            return job if c.get("status") == "True" else None

        job = wait_for(f"{name} stalled", stalled, op=operator)
        c = condition(job, "Stalled")
        assert c["reason"] == reason and field in c["message"], c
        warnings = [e for e in events_of(crd, namespace, name) if e["type"] == "Warning"]
        assert any(e["reason"] == reason and field in e["message"] for e in warnings), warnings
        assert not pods_of(crd, namespace, name)
    # Fixing a stalled job lets it run.
    crd.kubectl(
        "patch",
        "hj",
        "bad-partition",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec":{"parallelism":{"partition":"adaptive"}}}',
    )
    job = wait_phase(crd, namespace, "bad-partition", "Running", op=operator)
    assert condition(job, "Stalled")["status"] == "False"


def test_waits_for_nodes_with_a_condition_saying_what_is_missing(crd, namespace, operator):
    apply(crd, tiny_job("huge", namespace, count=8, command=SLEEP))

    job = wait_reconciling(crd, namespace, "huge", "WaitingForNodes", operator)
    msg = condition(job, "Reconciling")["message"]
    assert "needs 8 nodes" in msg and "have 6" in msg
    assert job["status"]["phase"] == "Pending" and not pods_of(crd, namespace, "huge")


def lease_holder(cluster, ns: str, name: str = "holmes-operator") -> str | None:
    r = cluster.kubectl("get", "lease", name, "-n", ns, "-o", "json", check=False)
    return json.loads(r.stdout)["spec"].get("holderIdentity") if r.returncode == 0 else None


def test_sigterm_stops_the_operator_at_once_and_hands_its_lease_over(crd, namespace, tmp_path):
    """A rollout's SIGTERM: the operator exits well inside Kubernetes' default 30 s grace period,
    having released its Lease, so the next replica leads at once rather than after the lease
    duration. (Its informers' idle watches once held the exit until the next event or the watch
    timeout, 270 s: the kubelet's SIGKILL came first and the Lease was never released.)"""
    op = OperatorProcess(
        crd.kubeconfig,
        [namespace],
        tmp_path / "op.log",
        extra=["--leader-elect", f"--leader-elect-namespace={namespace}", "--leader-elect-identity=op-a"],
    ).start()
    try:
        wait_for("the lease", lambda: lease_holder(crd, namespace) == "op-a", timeout=30)
        stopping = time.monotonic()
        op.proc.terminate()
        code = op.proc.wait(30)
        took = time.monotonic() - stopping
    finally:
        op.stop()
    assert code == 0 and took < 5, (code, took, op.tail(40))
    assert not lease_holder(crd, namespace), op.tail(40)  # released: free for the next replica


def replica(cluster, ns: str, tmp_path, ident: str, *extra: str, env: dict | None = None) -> OperatorProcess:
    """One replica of a leader-elected operator (not started), logging to ``<ident>.log``."""
    return OperatorProcess(
        cluster.kubeconfig,
        [ns],
        tmp_path / f"{ident}.log",
        extra=[
            "--leader-elect",
            f"--leader-elect-namespace={ns}",
            f"--leader-elect-identity={ident}",
            *extra,
        ],
        env=env,
    )


def test_leader_killed_the_follower_takes_over_within_the_lease_without_duplicates(crd, namespace, tmp_path):
    """Two replicas with --leader-elect: only the leader acts; SIGKILL it while a job runs and
    the follower leads once the lease runs out, adopts the running pods (same pods, no restart)
    and sees the job to Succeeded. With the default 15/10/2 s the follower may have seen the last
    renewal up to one retry late and looks once per retry, so it leads within duration + 2 retries."""
    ops = {ident: replica(crd, namespace, tmp_path, ident).start() for ident in ("op-a", "op-b")}
    try:
        first = wait_for("a leader", lambda: lease_holder(crd, namespace), timeout=30)
        leader, follower = ops[first], next(op for i, op in ops.items() if i != first)
        second = next(i for i in ops if i != first)
        apply(crd, tiny_job("ha", namespace, count=2, command=["sh", "-c", "sleep 20"]))
        wait_phase(crd, namespace, "ha", "Running", op=leader)
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods_of(crd, namespace, "ha")}
        leader.kill()
        killed = time.monotonic()
        wait_for(
            "the follower to lead", lambda: lease_holder(crd, namespace) == second, timeout=30, every=0.1
        )
        takeover = time.monotonic() - killed
        job = wait_phase(crd, namespace, "ha", "Succeeded", timeout=120, op=follower)
    finally:
        for ident, op in ops.items():
            op.stop()
            print(f"--- {ident}:\n{op.tail(30)}")
    print(f"takeover {takeover:.1f}s after the leader's SIGKILL")
    bound = LeaseConfig.duration + 2 * LeaseConfig.retry + 1  # +1 s: this shared machine's scheduling
    assert takeover <= bound, (takeover, bound)
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods_of(crd, namespace, "ha")}
    assert after == before and sorted(after) == ["ha-1-0", "ha-1-1"]
    assert job["status"]["restarts"] == 0 and job["status"]["attempt"] == 1
    launched = [e for e in events_of(crd, namespace, "ha") if e["reason"] == "Launched"]
    assert len(launched) == 1, launched
    assert "waiting to lead" in follower.tail(400)


WEDGE = Path(__file__).resolve().parent / "wedge"  # its sitecustomize hangs the named jobs' reconciles


def test_a_stuck_reconcile_fails_the_probe_and_the_standby_takes_over(crd, namespace, tmp_path):
    """Issue 46: a reconcile that never returns (forced by tests/e2e/operator/wedge in the leader
    only) fails the leader's health endpoint within --reconcile-bound, the leader stops renewing
    its Lease and exits, and the standby leads and sees the job through."""
    bound = 10

    # renewals stop once the bound is passed: the probe (bound + kopf's 10 s cache of a good
    # result) answers 500 before the renew deadline ends the process
    flags = (
        f"--reconcile-bound={bound}",
        "--leader-elect-lease-duration=30",
        "--leader-elect-renew-deadline=25",
    )
    path = os.pathsep.join(p for p in (str(WEDGE), os.environ.get("PYTHONPATH", "")) if p)
    wedged = {"PYTHONPATH": path, "HOLMES_TEST_WEDGE_JOBS": f"{namespace}/stuck"}
    leader = replica(crd, namespace, tmp_path, "op-a", *flags, env=wedged).start()
    standby = None
    try:
        wait_for("op-a to lead", lambda: lease_holder(crd, namespace) == "op-a", timeout=30)
        standby = replica(crd, namespace, tmp_path, "op-b", *flags).start()
        apply(crd, tiny_job("stuck", namespace, count=2, command=["sh", "-c", "sleep 3"]))
        applied = time.monotonic()
        # kopf keeps a good probe result 10 s: unhealthy within the bound and that
        wait_for("op-a unhealthy", lambda: leader.health_code() == 500, timeout=bound + 15, every=0.5)
        unhealthy = time.monotonic() - applied
        wait_for("op-b to lead", lambda: lease_holder(crd, namespace) == "op-b", timeout=60, every=0.2)
        took_over = time.monotonic() - applied
        code = leader.proc.wait(30)  # it exited, handing the Lease over
        job = wait_phase(crd, namespace, "stuck", "Succeeded", timeout=120, op=standby)
        assert standby.health_code() == 200
    finally:
        for op in (leader, standby):
            if op is not None:
                op.stop()
                print(op.tail(30))
    print(f"unhealthy {unhealthy:.1f}s, op-b leading {took_over:.1f}s after the job's apply (bound {bound}s)")
    assert unhealthy <= bound + 10 + 5  # + kopf's cache + this shared machine's scheduling
    assert code != 0 and "not renewing the leader lease" in leader.tail(400)
    assert job["status"]["restarts"] == 0
