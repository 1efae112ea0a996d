"""The member cluster's token for the hub (holmes.operator.core.member_token, `kubectl holmes
member-kubeconfig`): durations, the token's dates, the kubeconfig around it."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone

import pytest

from holmes.operator.core.member_token import TokenError, claims, expires, kubeconfig, seconds


def jwt(payload: dict) -> str:
    def part(d: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part(payload)}.c2ln"


@pytest.mark.parametrize(
    "text,want", [("168h", 168 * 3600), ("7d", 7 * 86400), ("1h30m", 5400), ("900s", 900), ("3600", 3600)]
)
def test_durations(text, want):
    assert seconds(text) == want


@pytest.mark.parametrize(
    "text,why",
    [
        ("5m", "minimum of 10m"),
        ("1w", "not a duration"),
        ("", "not a duration"),
        ("720h", "over the limit of 7d"),  # a leaked token that creates pods must die soon
        ("7d1s", "over the limit of 7d"),
    ],
)
def test_durations_refused_with_the_reason(text, why):
    with pytest.raises(TokenError, match=why):
        seconds(text)


def test_the_expiry_is_read_from_the_token():
    token = jwt({"iat": 1_800_000_000, "exp": 1_800_003_600, "sub": "system:serviceaccount:holmes-system:x"})
    assert claims(token)["sub"].endswith(":x")
    assert expires(token) == datetime(2027, 1, 15, 9, 0, tzinfo=timezone.utc)
    with pytest.raises(TokenError, match="no expiry"):
        expires(jwt({"sub": "x"}))  # a legacy Secret's token has no exp claim
    with pytest.raises(TokenError, match="not a JWT"):
        claims("opaque")


def test_the_kubeconfig_names_the_member_and_embeds_the_ca():
    cfg = kubeconfig("b", "https://b:6443", b"PEM", "tok", "holmes-member@b")
    assert cfg["current-context"] == "b"
    assert cfg["clusters"] == [
        {"name": "b", "cluster": {"server": "https://b:6443", "certificate-authority-data": "UEVN"}}
    ]
    assert cfg["users"] == [{"name": "holmes-member@b", "user": {"token": "tok"}}]
    assert cfg["contexts"][0]["context"] == {"cluster": "b", "user": "holmes-member@b"}
    assert (
        "certificate-authority-data"
        not in kubeconfig("b", "http://b", None, "t", "u")["clusters"][0]["cluster"]
    )
