"""Leader election: the Lease rules (pure) and two electors against the real API server."""

from __future__ import annotations

import asyncio
import time

import pytest
from kubernetes import client

from holmes.operator.leader import LeaderElector, LeaseConfig, may_acquire, next_spec


def test_a_lease_is_free_when_empty_mine_or_unchanged_for_its_duration():
    held = {"holderIdentity": "a", "leaseDurationSeconds": 8, "renewTime": "t"}
    assert may_acquire({}, "b", 0, 8)
    assert may_acquire({"holderIdentity": ""}, "b", 0, 8)  # released on a clean exit
    assert may_acquire(held, "a", 0, 8)
    assert not may_acquire(held, "b", 7.9, 8)
    assert may_acquire(held, "b", 8.0, 8)
    assert not may_acquire(dict(held, leaseDurationSeconds=30), "b", 10, 8)  # the holder's duration


def test_taking_a_lease_counts_a_transition_and_renewing_does_not():
    taken = next_spec({"holderIdentity": "a", "leaseTransitions": 2}, "b", 8, 1_700_000_000.5)
    assert taken["holderIdentity"] == "b" and taken["leaseTransitions"] == 3
    assert taken["acquireTime"] == taken["renewTime"] == "2023-11-14T22:13:20.500000Z"
    renewed = next_spec(taken, "b", 8, 1_700_000_002.0)
    assert renewed["leaseTransitions"] == 3 and renewed["acquireTime"] == taken["acquireTime"]
    assert renewed["renewTime"] == "2023-11-14T22:13:22.000000Z"
    assert next_spec({}, "a", 8, 0)["leaseTransitions"] == 0  # the first holder


def test_timings_must_nest():
    with pytest.raises(ValueError, match="retry"):
        LeaseConfig("ns", "l", "me", duration=4, renew_deadline=5, retry=1)


def test_an_api_server_that_refuses_connections_is_a_failed_try_not_the_end_of_the_election():
    from holmes_dev.ports import free_port

    conf = client.Configuration(host=f"https://127.0.0.1:{free_port()}")  # nothing listens there
    conf.verify_ssl = False
    elector = LeaderElector(client.ApiClient(conf), LeaseConfig("ns", "lease", "me", 4, 3, 0.5))
    # urllib3 retries the refused connection, then raises MaxRetryError (not an OSError); it
    # escaped the loop, so a follower facing a restarting API server never led again
    assert asyncio.run(elector._try()) is False


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
