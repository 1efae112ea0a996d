"""Leader election: the Lease rules (pure; two electors against the real API server:
tests/e2e/operator/test_leader.py)."""

from __future__ import annotations

import asyncio

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
