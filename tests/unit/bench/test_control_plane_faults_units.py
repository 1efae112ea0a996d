"""bench/control_plane_faults.py's verdict as data: duplicate pods, jobs lost or gone backwards,
phases their pods contradict, and orphans, from snapshots of jobs and pods."""

from __future__ import annotations

import control_plane_faults as cpf  # bench/ is on pytest's pythonpath


def pod(job, attempt, rank, phase="Running", deleting=False):
    meta = {
        "name": f"{job}-{attempt}-{rank}",
        "labels": {cpf.LABEL_JOB: job, cpf.LABEL_ATTEMPT: str(attempt), cpf.LABEL_RANK: str(rank)},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase}}


def job(name, **status):
    return {"metadata": {"name": name}, "status": status}


def snap(t, jobs, pods):
    return cpf.Snapshot(t, {j["metadata"]["name"]: j for j in jobs}, pods)


def test_two_live_pods_of_one_rank_are_a_duplicate_a_terminating_one_is_not():
    judge = cpf.Judge()
    judge.see(snap(0, [job("a", attempt=2)], [pod("a", 1, 0, deleting=True), pod("a", 2, 0)]))
    assert not judge.duplicates
    judge.see(snap(1, [job("a", attempt=2)], [pod("a", 1, 0), pod("a", 2, 0)]))
    assert judge.duplicates == {("a", "0")}


def test_a_job_that_vanishes_or_whose_status_goes_backwards_is_lost():
    judge = cpf.Judge(expected={"a", "b", "c", "new"})
    judge.see(snap(0, [job("a", attempt=2), job("b", phase="Succeeded", attempt=1), job("c", attempt=1)], []))
    judge.see(snap(1, [job("a", attempt=1), job("b", phase="Running", attempt=1)], []))
    assert set(judge.lost) == {"a", "b", "c"}  # not "new": a list may be older than its creation
    assert "attempt went back from 2 to 1" in judge.lost["a"]
    assert "from Succeeded back to Running" in judge.lost["b"]
    assert judge.lost["c"].startswith("the HolmesJob vanished")


def test_phases_the_pods_contradict_are_wrong_after_a_grace():
    judge = cpf.Judge()
    judge.see(snap(0, [job("a", phase="Succeeded", attempt=1)], [pod("a", 1, 0, "Failed")]))
    assert "Succeeded with a pod of its attempt Failed" in judge.wrong["a"]
    judge.see(snap(0, [job("b", phase="Failed", attempt=1)], [pod("b", 1, 0)]))
    judge.see(snap(cpf.FINISH_GRACE - 1, [job("b", phase="Failed", attempt=1)], [pod("b", 1, 0)]))
    assert "b" not in judge.wrong  # its pods are being stopped
    judge.see(snap(cpf.FINISH_GRACE + 1, [job("b", phase="Failed", attempt=1)], [pod("b", 1, 0)]))
    assert "while a pod of its attempt still runs" in judge.wrong["b"]


def test_the_end_wants_every_workload_job_succeeded_and_lists_orphans():
    judge = cpf.Judge()
    final = snap(
        9,
        [job("a", phase="Succeeded", attempt=2), job("b", phase="Failed", attempt=1)],
        [pod("a", 1, 0), pod("a", 2, 0, "Succeeded"), pod("gone", 1, 0), pod("b", 1, 1, "Failed")],
    )
    assert judge.end(final, ["a", "b"]) == ["a-1-0", "gone-1-0"]
    assert judge.wrong["b"] == "ended Failed, not Succeeded" and "a" not in judge.wrong


def test_p99_of_a_few_values_is_the_largest():
    assert cpf.p99([1.0, 5.0, 2.0]) == 5.0 and cpf.p99([]) == 0.0
    assert cpf.p99([float(i) for i in range(1, 201)]) == 198.0
