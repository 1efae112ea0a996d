"""A tenant cannot set its own priority (issue 50, item 2): runPolicy.priority, a raw number,
counts only in namespaces the operator's --raw-priority-namespaces lists; elsewhere the job is
Stalled (PolicyViolation) before it is queued anywhere, and priority comes from objects admins
own: a PriorityClass, or Kueue's WorkloadPriorityClass. `holmes plan` says so too."""

from __future__ import annotations

from pathlib import Path

import yaml

from holmes.cli import main
from holmes.contract import load_job
from holmes.contract.names import LABEL_KUEUE_PRIORITY_CLASS, LABEL_KUEUE_QUEUE
from holmes.operator.core import capacity
from holmes.operator.core.render import RenderSettings
from tests.helpers.operator.opfixtures import FakeWorld, manifest

REPO = Path(__file__).resolve().parents[3]
NODES = str(REPO / "examples" / "nodes" / "paper.yaml")
HIGHEST = 2_000_000_000  # what a tenant would grant itself: above every class of its own
FLAVORS = {"default-flavor": {"metadata": {"name": "default-flavor"}, "spec": {}}}


def job(name: str, namespace: str, created: int = 0, labels: dict | None = None, **run_policy) -> dict:
    m = manifest(name, count=2, runPolicy={"backoffLimit": 2, **run_policy})
    m["metadata"].update(namespace=namespace, uid=f"uid-{name}", labels=labels or {})
    m["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:{created:02}Z"
    return m


def test_a_raw_priority_stalls_the_job_naming_the_fix_and_creates_nothing():
    w = FakeWorld(job("greedy", "team-a", priority=HIGHEST))
    d = w.step()
    stalled = w.condition("Stalled")
    assert stalled["status"] == "True" and stalled["reason"] == "PolicyViolation"
    msg = stalled["message"]
    assert msg.startswith("spec.runPolicy.priority: namespace team-a may not set a raw priority")
    assert "--raw-priority-namespaces" in msg and "rawPriorityNamespaces" in msg
    assert "spec.runPolicy.priorityClassName" in msg and LABEL_KUEUE_PRIORITY_CLASS in msg
    assert not d.create_pods and w.configmap is None and "PolicyViolation" in w.reasons()
    # where the operator's policy allows it, the job runs
    w.settings = RenderSettings(raw_priority_namespaces=("team-a",))
    assert len(w.step().create_pods) == 2 and w.condition("Stalled")["status"] == "False"


def test_holmes_queue_counts_a_raw_priority_only_where_it_is_allowed():
    """Another job's reconcile orders the queue: a raw priority its namespace may not set does
    not put that job ahead of one whose PriorityClass grants more."""
    greedy = job("greedy", "team-a", created=0, priority=HIGHEST)
    fair = job("fair", "team-b", created=1, priorityClassName="high")
    seen = capacity.Workloads(jobs=[greedy, fair])
    classes = {"high": 1000}
    assert capacity.shared_state(fair, seen, classes).ahead == []
    ahead = capacity.shared_state(fair, seen, classes, raw_priority=("team-a",)).ahead
    assert [w.job for w in ahead] == ["team-a/greedy"] and ahead[0].priority == HIGHEST
    spec = load_job(greedy)
    assert capacity.priority_of(spec, classes) == (0, "")
    assert capacity.priority_of(spec, classes, raw_allowed=True) == (HIGHEST, "")


def test_kueue_gets_no_workload_for_a_raw_priority_and_the_class_value_otherwise():
    queued = {LABEL_KUEUE_QUEUE: "team-a"}
    w = FakeWorld(job("greedy", "team-a", labels=queued, priority=HIGHEST))
    w.flavors, w.workload_priority_classes = FLAVORS, {"low": 10}
    w.step()
    assert w.workload is None and w.condition("Stalled")["reason"] == "PolicyViolation"
    # the fix the message names: the WorkloadPriorityClass admins made for the team
    w.job["spec"]["runPolicy"].pop("priority")
    w.job["metadata"]["labels"][LABEL_KUEUE_PRIORITY_CLASS] = "low"
    w.step()
    assert w.workload["spec"]["priority"] == 10
    assert w.workload["spec"]["priorityClassRef"]["kind"] == "WorkloadPriorityClass"


def write_job(tmp_path, namespace: str | None = "team-a") -> str:
    m = yaml.safe_load((REPO / "examples" / "jobs" / "gpt-7b.yaml").read_text())
    m["spec"].setdefault("runPolicy", {})["priority"] = HIGHEST
    if namespace:
        m["metadata"]["namespace"] = namespace
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(m))
    return str(path)


def test_holmes_plan_does_not_accept_a_raw_priority_silently(tmp_path, capsys):
    path = write_job(tmp_path)
    assert main(["plan", "--nodes", NODES, "--job", path]) == 0  # the plan does not depend on it
    err = capsys.readouterr().err
    assert "warning: the operator would stall this job (PolicyViolation): spec.runPolicy.priority" in err
    # --pods: what the operator would create, which is nothing
    assert main(["plan", "--nodes", NODES, "--job", path, "--pods"]) != 0
    err = capsys.readouterr().err
    assert "PolicyViolation: spec.runPolicy.priority: namespace team-a" in err
    # with the operator's policy
    allow = ["--raw-priority-namespaces", "team-a"]
    assert main(["plan", "--nodes", NODES, "--job", path, *allow]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["plan", "--nodes", NODES, "--job", path, "--pods", *allow]) == 0
    capsys.readouterr()
    # a manifest without a namespace goes to default, or to --namespace
    path = write_job(tmp_path, None)
    assert main(["plan", "--nodes", NODES, "--job", path, "--namespace", "team-a", *allow]) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(["plan", "--nodes", NODES, "--job", path, *allow]) == 0
    assert "namespace default may not" in capsys.readouterr().err


def test_the_chart_value_reaches_the_operator_as_its_flag(monkeypatch):
    from holmes.operator.__main__ import parse_args
    from tests.helpers.packaging.packaging_helpers import one, render

    monkeypatch.setenv("HOLMES_TRAINER_IMAGE", "holmes-trainer:test")

    def flag(docs) -> tuple[str, ...]:
        c = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        return parse_args(c["args"]).raw_priority_namespaces

    assert flag(render()) == ()  # default: no namespace sets its own priority
    assert flag(render({"rawPriorityNamespaces": "{platform,batch}"})) == ("platform", "batch")
