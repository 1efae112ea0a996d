"""Leader election: two electors against the real API server (the Lease rules, pure:
tests/unit/operator/test_leader.py)."""

from __future__ import annotations

import asyncio
import time

from kubernetes import client

from holmes.operator.leader import LeaderElector, LeaseConfig


def test_one_leader_then_takeover_after_death_and_at_once_after_release(cluster, namespace):
    """Two electors on one Lease: one leads; when it stops renewing (dies) the other takes over
    after the lease duration; a clean release hands over on the follower's next look."""

    async def scenario() -> dict:
        lost = []
        cfg = dict(namespace=namespace, name="holmes-test", duration=3.0, renew_deadline=2.0, retry=0.5)
        a = LeaderElector(
            cluster.api_client(), LeaseConfig(identity="a", **cfg), on_lost=lambda: lost.append("a")
        )
        b = LeaderElector(
            cluster.api_client(), LeaseConfig(identity="b", **cfg), on_lost=lambda: lost.append("b")
        )
        ta = asyncio.create_task(a.run())
        await asyncio.wait_for(a.leading.wait(), 10)
        tb = asyncio.create_task(b.run())
        await asyncio.sleep(2.5)  # several looks: b must not lead while a renews
        assert not b.leading.is_set()
        ta.cancel()  # a dies without a word
        died = time.monotonic()
        await asyncio.wait_for(b.leading.wait(), 10)
        takeover = time.monotonic() - died
        # a comes back as a follower (a new process: it reads the Lease before anything)
        a2 = LeaderElector(
            cluster.api_client(), LeaseConfig(identity="a2", **cfg), on_lost=lambda: lost.append("a2")
        )
        ta2 = asyncio.create_task(a2.run())
        await asyncio.sleep(1.5)
        assert not a2.leading.is_set()
        tb.cancel()
        await asyncio.to_thread(b.release)
        released = time.monotonic()
        await asyncio.wait_for(a2.leading.wait(), 10)
        handover = time.monotonic() - released
        ta2.cancel()
        await asyncio.gather(ta, tb, ta2, return_exceptions=True)
        return {"takeover": takeover, "handover": handover, "lost": lost}

    r = asyncio.run(scenario())
    # the lease duration after a's last renewal (up to one retry before its death), plus one look
    assert 3.0 - 0.5 <= r["takeover"] <= 3.0 + 0.5 + 1.0, r
    assert r["handover"] <= 0.5 + 1.0, r
    assert r["lost"] == []
    lease = client.CoordinationV1Api(cluster.api_client()).read_namespaced_lease("holmes-test", namespace)
    assert lease.spec.holder_identity == "a2" and lease.spec.lease_transitions == 2
