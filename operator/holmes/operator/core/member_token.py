"""A member cluster's kubeconfig for the hub's operator, with a token that expires
(``kubectl holmes member-kubeconfig``, docs/multicluster.md#registering-a-member-cluster).

The token comes from the TokenRequest API (``serviceaccounts/token``, on every server since
1.12 that is started with a service-account issuer, 1.20 included), not from a
``kubernetes.io/service-account-token`` Secret, which never expires and stays valid until the
Secret is deleted. kubectl's own ``create token`` needs kubectl 1.24; this needs only the
Python client. Pure: the plugin (holmes.kubectl_holmes) makes the one API call."""

from __future__ import annotations

import base64
import json
import re
from datetime import datetime, timezone
from typing import Any

import yaml

MIN_SECONDS = 600  # the API server refuses a shorter expirationSeconds
# The longest a member token may live: the token creates pods in the member cluster, so a leaked
# one must die soon; rotation (docs/multicluster.md#rotating-the-token) renews it well before.
MAX_SECONDS = 7 * 86400
DEFAULT_DURATION = "24h"
DURATION = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


class TokenError(ValueError):
    pass


def seconds(duration: str) -> int:
    """``24h``, ``7d``, ``1h30m``, ``900s`` or a plain number of seconds -> seconds, at least
    the API server's minimum of 10 minutes and at most MAX_SECONDS (a week)."""
    text = duration.strip()
    if text.isdigit():
        total = int(text)
    else:
        m = DURATION.match(text)
        if not text or m is None or not any(m.groups()):
            raise TokenError(f"--duration: {duration!r} is not a duration such as 24h, 7d or 1h30m")
        d, h, mi, s = (int(g or 0) for g in m.groups())
        total = ((d * 24 + h) * 60 + mi) * 60 + s
    if total < MIN_SECONDS:
        raise TokenError(f"--duration: {duration} is below the API server's minimum of 10m")
    if total > MAX_SECONDS:
        raise TokenError(
            f"--duration: {duration} is over the limit of 7d (168h) for a token that creates pods: "
            "issue a shorter one and rotate it (docs/multicluster.md#rotating-the-token)"
        )
    return total


def claims(token: str) -> dict[str, Any]:
    """The JWT's payload, unverified (the API server verifies it; this only reads its dates)."""
    try:
        payload = token.split(".")[1]
        return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))
    except (IndexError, ValueError) as e:
        raise TokenError(f"the issued token is not a JWT: {e}") from None


def expires(token: str) -> datetime:
    exp = claims(token).get("exp")
    if not isinstance(exp, int):
        raise TokenError("the issued token has no expiry (exp claim)")
    return datetime.fromtimestamp(exp, tz=timezone.utc)


def kubeconfig(member: str, server: str, ca_pem: bytes | None, token: str, user: str) -> dict[str, Any]:
    """A kubeconfig with one context, ``member``, that authenticates with ``token``."""
    cluster: dict[str, Any] = {"server": server}
    if ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": member,
        "clusters": [{"name": member, "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": member, "context": {"cluster": member, "user": user}}],
    }


def token_request(expiration: int) -> dict[str, Any]:
    """The TokenRequest body: ``expiration`` seconds (the server may shorten it to its
    --service-account-max-token-expiration), for the API server's own audiences (none named)."""
    return {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": expiration},
    }


def kubeconfig_text(config: dict[str, Any]) -> str:
    return str(yaml.safe_dump(config, sort_keys=False))
