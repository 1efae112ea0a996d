"""The operator's discovery of optional APIs (Volcano, DRA) at start-up, against an API server
that is restarting: asked again until it answers, never failing the start-up."""

from __future__ import annotations

import pytest
from holmes_dev.ports import free_port
from kubernetes import client
from kubernetes.client.rest import ApiException

from holmes.operator.watches import serves_podgroups, until_answered


def refusing_api() -> client.ApiClient:
    conf = client.Configuration(host=f"https://127.0.0.1:{free_port()}")  # nothing listens there
    conf.verify_ssl = False
    return client.ApiClient(conf)


def test_discovery_while_the_api_server_restarts_is_asked_again_until_it_answers():
    api, calls, slept = refusing_api(), [], []

    def ask():
        calls.append(1)
        if len(calls) < 4:  # the real client's error for a refused connection: urllib3's MaxRetryError
            return serves_podgroups(api)
        return "answered"

    assert until_answered(ask, slept.append) == "answered"
    assert slept == [1, 2, 4]  # it raised out of kopf's start-up activity, retried only 60 s later


def test_an_api_server_that_answers_with_a_client_error_is_not_asked_again():
    def forbidden():
        raise ApiException(status=403, reason="Forbidden")

    with pytest.raises(ApiException):
        until_answered(forbidden, lambda s: None)


def test_the_operator_waits_until_the_api_server_serves_holmesjobs(cluster):
    from holmes.operator.__main__ import crd_served
    from localkube.operatorproc import install_crd

    install_crd(cluster)
    assert crd_served(cluster.api_client()) is True
    # a starting API server (connection refused, then no CRDs served yet) is asked again:
    # kopf resolved the HolmesJob resource once, at start-up, and an operator started too early
    # led while serving no HolmesJob at all
    slept = []
    with pytest.raises(Exception) as e:
        crd_served(refusing_api())
    assert until_answered(lambda: slept.append(1) or crd_served(cluster.api_client()), slept.append)
    assert "MaxRetryError" in type(e.value).__name__
