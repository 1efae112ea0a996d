"""One HolmesJob across two Kubernetes control planes (the ``member_clusters`` fixture: east,
which doubles as the hub, and west), with the operator as a subprocess against the hub and the
members registered as Secrets there. Kept lean: one operator for the module, tiny jobs."""

from __future__ import annotations

import json
import os
import signal
import uuid

import pytest
import yaml
from holmes_dev.jobs import tiny_job, tiny_training
from holmes_dev.kubectl import require_established

from localkube.controlplane import binary
from localkube.multicluster import MEMBERS_NAMESPACE
from localkube.operatorproc import CRD, CRD_NAME, OperatorProcess
from tests.helpers import polling

pytestmark = pytest.mark.timeout(420)

SLEEP = ["sh", "-c", "sleep 600"]


@pytest.fixture(scope="module")
def hub(member_clusters):
    mc = member_clusters
    mc.kubectl(mc.hub, "apply", "-f", str(CRD))
    require_established(binary("kubectl"), str(mc.kubeconfig(mc.hub)), CRD_NAME)
    mc.register(MEMBERS_NAMESPACE)
    return mc


@pytest.fixture(scope="module")
def operator(hub, tmp_path_factory):
    op = OperatorProcess(
        str(hub.kubeconfig(hub.hub)),
        None,
        tmp_path_factory.mktemp("multi") / "operator.log",
        extra=[
            f"--members-namespace={MEMBERS_NAMESPACE}",
            "--restart-backoff-seconds=1",
            "--restart-backoff-max-seconds=2",
        ],
    ).start()
    yield op
    op.stop()
    print(op.tail(80))


@pytest.fixture
def ns(hub):
    name = f"m-{uuid.uuid4().hex[:8]}"
    hub.ensure_namespace(name)  # in every member; east is the hub too
    yield name
    for m in hub.members:
        hub.kubectl(m, "delete", "namespace", name, "--wait=false", check=False)


def job(name, ns, count=4, command=None, iterations=4, **spec):
    sections = {
        "training": tiny_training(iterations, activationRecompute=False),
        "parallelism": {"pipeline": 2},
    }
    return tiny_job(name, ns, count, command=command, **sections | spec)


def apply(mc, obj):
    mc.kubectl(mc.hub, "apply", "-f", "-", input=yaml.safe_dump(obj))


def get_job(mc, ns, name):
    out = mc.kubectl(mc.hub, "get", "holmesjob", name, "-n", ns, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


def pods(mc, member, ns, name):
    out = mc.kubectl(member, "get", "pods", "-n", ns, "-l", f"holmes.dev/job-name={name}", "-o", "json")
    return json.loads(out)["items"]


def children(mc, member, ns, name):
    out = mc.kubectl(
        member, "get", "pods,configmaps,services", "-n", ns, "-l", f"holmes.dev/job-name={name}", "-o", "name"
    )
    return out.split()


def wait(what, fn, op, timeout=120):
    return polling.wait_for(what, fn, timeout, 0.5, detail=lambda: f"\noperator log:\n{op.tail()}")


def wait_status(mc, ns, name, op, check, what, timeout=120):
    def probe():
        j = get_job(mc, ns, name)
        st = (j or {}).get("status") or {}
        return j if check(st) else None

    try:
        return wait(what, probe, op, timeout)
    except AssertionError:
        st = (get_job(mc, ns, name) or {}).get("status")
        raise AssertionError(
            f"{name}: {what} never came; status {json.dumps(st, indent=1)}\n{op.tail()}"
        ) from None


def condition(j, type_):
    return next((c for c in j["status"].get("conditions", []) if c["type"] == type_), {})


def env(pod):
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_a_job_trains_across_both_members_to_succeeded(hub, operator, ns):
    apply(hub, job("across", ns))
    j = wait_status(
        hub,
        ns,
        "across",
        operator,
        lambda st: st.get("phase") in ("Succeeded", "Failed"),
        "a finished job",
        timeout=300,
    )
    assert j["status"]["phase"] == "Succeeded", json.dumps(j["status"], indent=1)
    placed = {m: pods(hub, m, ns, "across") for m in hub.members}
    assert all(placed[m] for m in hub.members), "ranks run in both members"
    by_rank = {int(p["metadata"]["labels"]["holmes.dev/node-rank"]): p for ps in placed.values() for p in ps}
    rank0_ip = by_rank[0]["status"]["podIP"]
    for rank, p in by_rank.items():
        assert "ownerReferences" not in p["metadata"]  # none across clusters
        assert p["metadata"]["annotations"]["holmes.dev/job-uid"] == j["metadata"]["uid"]
        if rank:
            assert env(p)["MASTER_ADDR"] == rank0_ip
    # each stage's data-parallel group stays inside one member
    member_of = {p["spec"]["nodeName"]: m for m, ps in placed.items() for p in ps}
    for stage in j["status"]["layout"]["stages"]:
        assert len({member_of[n] for n in stage["nodes"]}) == 1, stage
    st = j["status"]["members"]
    assert {m: (e["reachable"], e["succeeded"]) for m, e in st.items()} == {
        m: (True, len(placed[m])) for m in hub.members
    }
    assert condition(j, "MembersReachable")["status"] == "True"
    assert j["status"]["progress"]["iteration"] == 4
    # a finished job's children (pods force-deleted at once by the node agent) go too
    hub.kubectl(hub.hub, "delete", "holmesjob", "across", "-n", ns, "--wait=true", "--timeout=90s")
    for m in hub.members:
        assert children(hub, m, ns, "across") == [], m


def test_deleting_a_pod_in_one_member_restarts_the_gang_in_both_and_deleting_the_job_cleans_both(
    hub, operator, ns
):
    apply(hub, job("gang", ns, command=SLEEP))
    wait_status(hub, ns, "gang", operator, lambda st: st.get("phase") == "Running", "Running")
    first = {m: [p["metadata"]["name"] for p in pods(hub, m, ns, "gang")] for m in hub.members}
    assert all(first.values()), first
    hub.kubectl("west", "delete", "pod", first["west"][0], "-n", ns, "--wait=false")
    j = wait_status(
        hub,
        ns,
        "gang",
        operator,
        lambda st: st.get("attempt") == 2 and st.get("phase") == "Running",
        "attempt 2 Running",
    )
    assert j["status"]["restartsByReason"] == {"disruption": 1}
    for m in hub.members:  # the whole gang was replaced, in both members
        wait(
            f"attempt 1 gone from {m}",
            lambda m=m: (
                not any(p["metadata"]["name"].startswith("gang-1-") for p in pods(hub, m, ns, "gang"))
            ),
            operator,
        )
    assert sum(len(pods(hub, m, ns, "gang")) for m in hub.members) == 4

    assert j["metadata"]["finalizers"] == ["holmes.dev/member-children"]
    hub.kubectl(hub.hub, "delete", "holmesjob", "gang", "-n", ns, "--wait=true", "--timeout=120s")
    for m in hub.members:
        assert children(hub, m, ns, "gang") == [], m


def test_an_unreachable_member_is_reported_the_gang_restarts_on_what_is_left_and_nothing_wedges(
    hub, operator, ns
):
    apply(
        hub,
        job(
            "elastic", ns, command=SLEEP, nodes={"count": 4, "minCount": 2, "gpusPerNode": 1}, parallelism={}
        ),
    )
    wait_status(hub, ns, "elastic", operator, lambda st: st.get("phase") == "Running", "Running")
    assert pods(hub, "west", ns, "elastic")
    apiserver = hub.plane("west").state()["pids"]["kube-apiserver"]
    os.kill(apiserver, signal.SIGSTOP)  # west's API server stops answering (connections hang)
    try:
        j = wait_status(
            hub,
            ns,
            "elastic",
            operator,
            lambda st: st.get("attempt") == 2 and st.get("phase") == "Running",
            "attempt 2 Running on east",
            timeout=150,
        )
        st = j["status"]
        assert st["members"]["west"]["reachable"] is False and st["members"]["west"]["nodes"] == 0
        assert condition(j, "MembersReachable")["status"] == "False"
        assert "west" in condition(j, "MembersReachable")["message"]
        assert st["restartsByReason"] == {"disruption": 1} and st["size"]["current"] < 4
        assert {p["metadata"]["name"] for p in pods(hub, "east", ns, "elastic")} >= {"elastic-2-0"}
        # another job still gets served while west hangs
        apply(hub, job("meanwhile", ns, count=2, command=SLEEP, parallelism={}))
        wait_status(
            hub,
            ns,
            "meanwhile",
            operator,
            lambda s: s.get("phase") in ("Running", "Pending") and s.get("attempt") == 1,
            "the second job handled",
        )
    finally:
        os.kill(apiserver, signal.SIGCONT)
    # west back: reported, its stale pods deleted; then deleting the job cleans both members
    wait_status(
        hub,
        ns,
        "elastic",
        operator,
        lambda st: st.get("members", {}).get("west", {}).get("reachable"),
        "west reachable again",
    )
    wait("west's stale pods deleted", lambda: not pods(hub, "west", ns, "elastic"), operator, timeout=120)
    for name in ("elastic", "meanwhile"):
        hub.kubectl(hub.hub, "delete", "holmesjob", name, "-n", ns, "--wait=true", "--timeout=120s")
    for m in hub.members:
        assert children(hub, m, ns, "elastic") == [], m
