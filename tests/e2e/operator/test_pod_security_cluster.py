"""The job policy on the real local control plane: one HolmesJob per Pod Security control's failing
case (tests/helpers/operator/pss_cases.py), all applied at once in one cluster session: baseline cases to
an operator with the default policy, restricted ones to an operator at --policy-level restricted.
Each job must end Stalled, reason PolicyViolation, naming its field and flag, with no pod; a job
whose template the policy accepts gets its pod from the same operator."""

from __future__ import annotations

import copy
import json
import uuid

import pytest
from holmes_dev.jobs import tiny_job

from localkube.operatorproc import OperatorProcess, install_crd
from tests.helpers.operator.cluster_helpers import SLEEP, wait_for
from tests.helpers.operator.pss_cases import CASES, RESTRICTED

pytestmark = pytest.mark.timeout(300)


def jobs_by_name(cluster, ns) -> dict[str, dict]:
    items = cluster.get_json("holmesjobs", "-n", ns)["items"]
    return {j["metadata"]["name"]: j for j in items}


def stalled(job: dict | None) -> dict | None:
    for c in ((job or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == "Stalled" and c["status"] == "True":
            return c
    return None


def test_every_control_stalls_its_job_with_the_field_and_the_flag_and_creates_no_pod(
    cluster, namespace, tmp_path
):
    install_crd(cluster)
    ns_restricted = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", ns_restricted)
    ops = [
        OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "baseline.log").start(),
        OperatorProcess(
            cluster.kubeconfig,
            [ns_restricted],
            tmp_path / "restricted.log",
            extra=["--policy-level=restricted"],
        ).start(),
    ]
    try:
        tried = {}  # (namespace, job name) -> case
        items = []
        for i, case in enumerate(CASES):
            ns = ns_restricted if case.level == RESTRICTED else namespace
            name = f"pss-{i}"
            tried[(ns, name)] = case
            items.append(tiny_job(name, ns, count=1, template=copy.deepcopy(case.fail)))
        accepted = {  # passes every control: the operator creates its pod
            "spec": {
                "containers": [
                    {
                        "name": "trainer",
                        "command": SLEEP,
                        "securityContext": {"allowPrivilegeEscalation": False},
                    }
                ]
            }
        }
        items.append(tiny_job("accepted", namespace, count=1, template=accepted))
        cluster.kubectl(
            "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        )

        def all_reconciled():  # each job's first reconcile writes its conditions
            jobs = {**jobs_by_name(cluster, namespace), **jobs_by_name(cluster, ns_restricted)}
            waiting = [
                n for (_, n) in tried if not ((jobs.get(n) or {}).get("status") or {}).get("conditions")
            ]
            return None if waiting else jobs

        jobs = wait_for("every job reconciled", all_reconciled, timeout=120, op=ops[0])
        refused = []
        for (_, name), case in tried.items():
            c = stalled(jobs[name]) or {}
            if (
                c.get("reason") == "PolicyViolation"
                and f"spec.template.{case.path}: " in c["message"]
                and f"--{case.flag}" in c["message"]
            ):
                refused.append(name)
            else:
                print(f"{case.id}: not refused as expected: {jobs[name].get('status')}")
        pods = {
            ns: cluster.get_json("pods", "-n", ns, "-l", "holmes.dev/job-name")["items"]
            for ns in (namespace, ns_restricted)
        }
        wait_for(
            "the accepted job's pod",
            lambda: cluster.get_json("pods", "-n", namespace, "-l", "holmes.dev/job-name=accepted")["items"],
            timeout=60,
            op=ops[0],
        )
        print(f"refused {len(refused)} / tried {len(tried)} (controls: {len({c.control for c in CASES})})")
        assert len(refused) == len(tried)
        with_pods = [p["metadata"]["labels"]["holmes.dev/job-name"] for ns in pods for p in pods[ns]]
        assert set(with_pods) <= {"accepted"}, with_pods
    finally:
        for op in ops:
            op.stop()
        cluster.kubectl("delete", "namespace", ns_restricted, "--wait=false", check=False)
