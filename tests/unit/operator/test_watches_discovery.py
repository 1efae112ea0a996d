"""The operator's discovery of optional APIs (Volcano, DRA) at start-up, against an API server
that is restarting: asked again until it answers, never failing the start-up."""

from __future__ import annotations

import pytest
from kubernetes.client.rest import ApiException

from holmes.operator.watches import serves_podgroups, until_answered
from tests.helpers.operator.opfixtures import refusing_api


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
