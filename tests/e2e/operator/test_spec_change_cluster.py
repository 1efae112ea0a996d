"""A chart upgrade leaves running jobs alone (issue 50, item 1), on the real API server: a job
launched by the previous release's operator (its own sources, from git) under a CRD before
``parallelism.expert`` had a default; then the upgrade: the new CRD (the API server now fills
``expert: auto`` into the stored job) and the new operator; then a label added under
``template.metadata``. The pods stay (same UIDs, same attempt). A field the plan depends on then
relaunches the job, naming the field in the Event and the condition."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest
import yaml
from holmes_dev.jobs import tiny_job
from holmes_dev.kubectl import require_established

from localkube.controlplane import binary
from localkube.operatorproc import CRD, CRD_NAME, OperatorProcess, install_crd
from tests.helpers.operator.cluster_helpers import (
    SLEEP,
    condition,
    events_of,
    get_job,
    pods_of,
    wait_for,
    wait_phase,
)

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[3]
# main before the launch record (launch-spec.json): the release whose jobs the upgrade adopts
PREVIOUS = "6d2f2d0"


def previous_release(tmp_path: Path) -> Path:
    """The previous release's sources (its operator and contract packages), from git."""
    r = subprocess.run(
        ["git", "-C", str(REPO), "archive", PREVIOUS, "operator", "contract", "crds"],
        capture_output=True,
        check=False,
    )
    if r.returncode != 0:
        pytest.skip(
            f"the previous release {PREVIOUS} is not in this checkout's git history: {r.stderr[-200:]!r}"
        )
    out = tmp_path / "previous"
    with tarfile.open(fileobj=io.BytesIO(r.stdout)) as tar:
        tar.extractall(out, filter="data")
    return out


def crd_without_the_expert_default(source: Path) -> str:
    """The CRD as it was before parallelism.expert had a default (the field that, added, made
    the API server change every stored job)."""
    crd = yaml.safe_load(source.read_text())
    for version in crd["spec"]["versions"]:
        spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
        del spec["properties"]["parallelism"]["properties"]["expert"]["default"]
    return yaml.safe_dump(crd)


def live(pods: list[dict]) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    }


def patch(cluster, ns, name, body: str) -> None:
    cluster.kubectl("patch", "hj", name, "-n", ns, "--type=merge", "-p", body)


def test_a_chart_upgrade_and_a_policy_label_leave_a_running_job_alone(crd, namespace, tmp_path):
    prev = previous_release(tmp_path)
    cluster = crd
    cluster.kubectl("apply", "-f", "-", input=crd_without_the_expert_default(prev / CRD.relative_to(REPO)))
    require_established(binary("kubectl"), cluster.kubeconfig, CRD_NAME)
    old = OperatorProcess(
        cluster.kubeconfig,
        [namespace],
        tmp_path / "previous-operator.log",
        env={"PYTHONPATH": f"{prev / 'operator'}:{prev / 'contract'}"},
    )
    new = None
    try:
        old.start()
        job = tiny_job("steady", namespace, command=SLEEP, parallelism={"tensor": 1})
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(job))
        wait_phase(cluster, namespace, "steady", "Running", timeout=120, op=old)
        stored = get_job(cluster, namespace, "steady")
        assert "expert" not in stored["spec"]["parallelism"]  # no default for it yet
        before = live(pods_of(cluster, namespace, "steady"))
        assert len(before) == 4
        old.stop()
        cm = cluster.get_json("configmap", "steady-layout", "-n", namespace)
        assert "launch-spec.json" not in cm["data"]  # written by the previous release indeed

        # the chart upgrade: the new CRD, then the new operator
        install_crd(cluster.kubeconfig)
        wait_for(  # the API server reads the stored job through the new schema
            "the new default in the stored job",
            lambda: (
                get_job(cluster, namespace, "steady")["spec"]["parallelism"].get("expert") == "auto" or None
            ),
            timeout=30,
        )
        new = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log").start()
        # a policy engine or a GitOps tool labels the pod template (a new generation)
        patch(cluster, namespace, "steady", '{"spec":{"template":{"metadata":{"labels":{"team":"a"}}}}}')
        generation = get_job(cluster, namespace, "steady")["metadata"]["generation"]
        job = wait_for(
            "the new operator to act on the labelled generation",
            lambda: (lambda j: j if j["status"].get("observedGeneration") == generation else None)(
                get_job(cluster, namespace, "steady")
            ),
            op=new,
        )
        assert job["status"]["attempt"] == 1 and job["status"]["phase"] == "Running", job["status"]
        assert live(pods_of(cluster, namespace, "steady")) == before
        assert "SpecChanged" not in {e["reason"] for e in events_of(cluster, namespace, "steady")}

        # a field the plan depends on: relaunched, the field named
        patch(cluster, namespace, "steady", '{"spec":{"training":{"iterations":9}}}')
        job = wait_for(
            "the relaunch",
            lambda: (lambda j: j if j["status"].get("attempt") == 2 else None)(
                get_job(cluster, namespace, "steady")
            ),
            op=new,
        )
        relaunched = condition(job, "Relaunched")
        assert relaunched["reason"] == "SpecChanged", job["status"]
        assert relaunched["message"] == "attempt 2: spec.training.iterations changed"
        (msg,) = [
            e["message"] for e in events_of(cluster, namespace, "steady") if e["reason"] == "SpecChanged"
        ]
        assert msg.startswith("spec.training.iterations changed: relaunching all pods"), msg
        wait_phase(cluster, namespace, "steady", "Running", timeout=120, op=new)
        after = live(pods_of(cluster, namespace, "steady"))
        assert len(after) == 4 and not set(after.values()) & set(before.values())
        assert job["status"]["restarts"] == 0
    finally:
        old.stop()
        if new is not None:
            new.stop()
            print(new.tail(80))
        print(old.tail(40))
        install_crd(cluster.kubeconfig)  # the current CRD for the tests after this one
