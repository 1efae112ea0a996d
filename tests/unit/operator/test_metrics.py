"""The operator's per-job metrics by namespace: a tenant's jobs have series of their own, and a
namespace's series go when its last job does (a served namespace list bounds them)."""

from __future__ import annotations

from holmes.operator import metrics


def jobs() -> dict[tuple[str, str], float]:
    (family,) = metrics.JOBS.collect()
    return {(s.labels["job_namespace"], s.labels["phase"]): s.value for s in family.samples}


def test_jobs_are_counted_per_namespace_and_phase_and_a_gone_namespace_leaves():
    t = metrics.PhaseTracker()
    t.set(("team-a", "j1"), "Running")
    t.set(("team-a", "j2"), "Pending")
    t.set(("team-b", "j1"), "Running")
    got = jobs()
    assert got[("team-a", "Running")] == 1 and got[("team-a", "Pending")] == 1
    assert got[("team-b", "Running")] == 1 and got[("team-b", "Failed")] == 0
    t.set(("team-b", "j1"), None)  # deleted
    assert not [k for k in jobs() if k[0] == "team-b"]
    assert t.counts()["Running"] == 1 and t.by_namespace() == {
        "team-a": {p: int(p in ("Running", "Pending")) for p in metrics.PHASES}
    }
    t.set(("team-a", "j1"), None)
    t.set(("team-a", "j2"), None)
    assert not jobs()
