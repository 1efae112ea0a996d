"""Fixtures of the bench tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def fabric():
    """bench/fabric_netns, where this machine can build the emulated fabric (root, iproute2, veth,
    bridge, tbf; cgroups for the budgeted ranks); the probe waits for a fabric already running (a
    measurement) to finish."""
    import fabric_netns

    if os.geteuid() != 0:
        pytest.skip("root: network namespaces, tc and cgroups need root")
    with fabric_netns.exclusive():
        problems = fabric_netns.missing_prerequisites()
    if problems:
        pytest.skip("; ".join(problems))
    return fabric_netns
