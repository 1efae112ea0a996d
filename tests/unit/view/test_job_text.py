"""`kubectl holmes status` and `why` as text (holmes.view.job_text): pure, from a job's status."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from holmes.view import job_text

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=timezone.utc)


def iso(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def job(**status):
    return {"metadata": {"name": "j", "namespace": "lab"}, "status": status}


RUNNING = dict(
    phase="Running",
    attempt=2,
    restarts=1,
    layout={
        "shape": "2x1x1",
        "nodes": 2,
        "configMap": "j-layout",
        "stages": [
            {"index": 0, "island": "east/infiniband", "layers": [0, 3], "nodes": ["ib-0"]},
            {"index": 1, "island": "west/roce", "layers": [3, 4], "nodes": ["roce-0"], "gpu": "H100"},
        ],
        "dpGroups": [{"stage": 0, "net": "IB"}, {"stage": 1, "net": "IB"}],
        "estimate": {"iterationSeconds": 0.5},
    },
    progress={
        "iteration": 120,
        "iterations": 1000,
        "percentComplete": 12,
        "iterationsPerSecond": 2.0,
        "estimatedRemaining": "7m20s",
        "loss": 3.25,
        "tflopsPerGpu": 1.5,
        "iterationSeconds": 0.4,
        "updateTime": iso(3),
        "stages": [
            {
                "stage": 0,
                "layers": 3,
                "computeSeconds": 0.3,
                "plannedComputeSeconds": 0.25,
                "layerSeconds": 0.01,
            },
            {"stage": 1, "layers": 1, "computeSeconds": 0.1, "plannedComputeSeconds": 0.12},
        ],
    },
)


def test_status_shows_layout_progress_with_eta_and_measured_next_to_planned():
    text = "\n".join(job_text.status_lines(job(**RUNNING), NOW))
    assert "HolmesJob lab/j: Running (attempt 2, 1 restarts)" in text
    assert "iteration 120/1000 (12%), 2 iterations/s, ETA 7m20s" in text and "(read 3s ago)" in text
    assert "east/infiniband" in text and "west/roce" in text and "H100" in text
    assert "0.3 (0.25)" in text and "0.1 (0.12)" in text  # measured (planned) compute


def test_why_on_a_healthy_job_says_nothing_keeps_it_waiting():
    text = "\n".join(job_text.why_lines(job(**RUNNING), [], [], NOW))
    assert "nothing keeps it waiting: progress: iteration 120/1000" in text


def test_why_gives_the_condition_message_and_the_fix():
    st = job(
        phase="Pending",
        waitingSince=iso(600),
        conditions=[
            {
                "type": "Reconciling",
                "status": "True",
                "reason": "WaitingForNodes",
                "message": "needs 40 nodes; have 6",
                "lastTransitionTime": iso(600),
            }
        ],
    )
    pods = [
        {
            "metadata": {"name": "j-1-0"},
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/6 nodes",
                    }
                ],
            },
        }
    ]
    events = [
        {"type": "Normal", "reason": "Planned", "message": "x", "lastTimestamp": iso(700)},
        {
            "type": "Warning",
            "reason": "FabricMismatch",
            "message": "rank 3 on sockets",
            "count": 3,
            "lastTimestamp": iso(30),
        },
    ]
    text = "\n".join(job_text.why_lines(st, events, pods, NOW))
    assert "Reconciling: WaitingForNodes (since 10m ago)" in text and "needs 40 nodes; have 6" in text
    assert "fix: add or repair nodes" in text and "waiting for nodes since 10m ago" in text
    assert "pod j-1-0: Unschedulable: 0/6 nodes" in text
    assert "FabricMismatch x3 (30s ago): rank 3 on sockets" in text and "Planned" not in text
    assert "nothing keeps it waiting" not in text


def test_why_flags_a_trainer_that_stopped_reporting():
    quiet = {**RUNNING, "progress": {**RUNNING["progress"], "updateTime": iso(900)}}
    text = "\n".join(job_text.why_lines(job(**quiet), [], [], NOW))
    assert "no new iteration reported for 900s (last: iteration 120)" in text
    assert "kubectl logs j-2-0" in text and "nothing keeps it waiting" not in text


def test_list_shows_one_row_per_job_with_the_namespace_under_all_namespaces():
    running = {
        "metadata": {"namespace": "lab", "name": "big", "creationTimestamp": iso(7200 + 60)},
        "status": {"phase": "Running", "progress": {"percentComplete": 42, "estimatedRemaining": "3m"}},
    }
    new = {"metadata": {"namespace": "east", "name": "new", "creationTimestamp": iso(30)}}
    head, *rows = job_text.list_lines([running, new], NOW, all_namespaces=True)
    assert head.split() == ["NAMESPACE", "NAME", "PHASE", "DONE%", "ETA", "AGE"]
    assert rows[0].split() == ["lab", "big", "Running", "42", "3m", "2h01m"]
    assert rows[1].split() == ["east", "new", "-", "-", "-", "30s"]
    assert job_text.list_lines([new], NOW, all_namespaces=False)[0].split()[0] == "NAME"
    assert job_text.list_lines([], NOW, all_namespaces=True) == ["no HolmesJobs"]
