"""The operator waits at start-up until the real API server serves HolmesJobs (its discovery against
a restarting API server, faked: tests/unit/operator/test_watches_discovery.py)."""

from __future__ import annotations

import pytest

from holmes.operator.watches import until_answered
from tests.helpers.operator.opfixtures import refusing_api


def test_the_operator_waits_until_the_api_server_serves_holmesjobs(cluster):
    from holmes.operator.__main__ import crd_served
    from localkube.operatorproc import install_crd

    install_crd(cluster.kubeconfig)
    assert crd_served(cluster.api_client()) is True
    # a starting API server (connection refused, then no CRDs served yet) is asked again:
    # kopf resolved the HolmesJob resource once, at start-up, and an operator started too early
    # led while serving no HolmesJob at all
    slept = []
    with pytest.raises(Exception) as e:
        crd_served(refusing_api())
    assert until_answered(lambda: slept.append(1) or crd_served(cluster.api_client()), slept.append)
    assert "MaxRetryError" in type(e.value).__name__
