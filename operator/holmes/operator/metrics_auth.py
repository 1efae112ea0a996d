"""Who may read the operator's metrics, decided as controller-runtime's secure metrics serving
decides it (its filters.WithAuthenticationAndAuthorization): the request's bearer token goes
to the API server in a TokenReview (authentication.k8s.io/v1); the user it names is checked
with a SubjectAccessReview (authorization.k8s.io/v1) for ``get`` on the non-resource URL of
the request (``/metrics``), which RBAC grants with a ClusterRole rule ``nonResourceURLs:
["/metrics"], verbs: ["get"]`` (kube-prometheus-stack's Prometheus has it).

Pure: the two reviews are made by callables given to :class:`MetricsAuthorizer` (the API
calls are metrics_server.py's); answers are kept for a short while, as the API server's
delegating authenticator and authorizer keep theirs, so that a scrape every few seconds does
not cost two API requests each."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

ALLOW_TTL = 60.0  # seconds an allowed token stays allowed without asking again
DENY_TTL = 10.0  # ... and a refused one refused (a new RoleBinding takes effect within this)
MAX_CACHED = 256  # tokens remembered at most (scrapers are few; a flood of bad tokens is not)

Review = Callable[[dict[str, Any]], Mapping[str, Any]]  # a review object in, the API's answer out


@dataclass(frozen=True)
class Verdict:
    status: int  # the HTTP status to answer: 200, 401 (who are you?), 403 (not you), 500
    reason: str  # for the log and the answer's body: never the token


def bearer_token(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None without one)."""
    scheme, _, token = (header or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def token_review(token: str) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}}


def reviewed_user(answer: Mapping[str, Any]) -> dict[str, Any] | None:
    """The user a TokenReview's answer authenticated (None: the token is not valid)."""
    status = answer.get("status") or {}
    if status.get("authenticated") is not True:
        return None
    return dict(status.get("user") or {})


def access_review(user: Mapping[str, Any], path: str, verb: str = "get") -> dict[str, Any]:
    """A SubjectAccessReview: may ``user`` (a TokenReview's status.user) ``verb`` the
    non-resource URL ``path``?"""
    spec: dict[str, Any] = {"nonResourceAttributes": {"path": path, "verb": verb}}
    spec["user"] = user.get("username", "")
    for key in ("uid", "groups", "extra"):
        if user.get(key):
            spec[key] = user[key]
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}


def access_allowed(answer: Mapping[str, Any]) -> tuple[bool, str]:
    """(allowed, the authorizer's reason) of a SubjectAccessReview's answer."""
    status = answer.get("status") or {}
    allowed = status.get("allowed") is True and status.get("denied") is not True
    return allowed, str(status.get("reason") or status.get("evaluationError") or "")


class MetricsAuthorizer:
    """``check(authorization header, path)`` -> Verdict, asking the API server through
    ``review_token`` and ``review_access`` (each: a review object in, the answer out; raising
    when the API server does not answer), with answers kept ALLOW_TTL / DENY_TTL seconds."""

    def __init__(
        self,
        review_token: Review,
        review_access: Review,
        clock: Callable[[], float] = time.monotonic,
        allow_ttl: float = ALLOW_TTL,
        deny_ttl: float = DENY_TTL,
    ) -> None:
        self.review_token, self.review_access, self.clock = review_token, review_access, clock
        self.allow_ttl, self.deny_ttl = allow_ttl, deny_ttl
        self._lock = threading.Lock()
        self._kept: dict[tuple[str, str], tuple[float, Verdict]] = {}  # (token, path) -> (until, verdict)

    def check(self, authorization: str | None, path: str) -> Verdict:
        token = bearer_token(authorization)
        if token is None:
            return Verdict(401, "no bearer token: send the Authorization: Bearer header")
        now = self.clock()
        with self._lock:
            kept = self._kept.get((token, path))
        if kept and kept[0] > now:
            return kept[1]
        try:
            verdict = self._decide(token, path)
        except Exception as e:  # the API server did not answer: refuse, remember nothing
            return Verdict(500, f"could not review the token with the API server: {type(e).__name__}: {e}")
        ttl = self.allow_ttl if verdict.status == 200 else self.deny_ttl
        with self._lock:
            if len(self._kept) >= MAX_CACHED:
                self._kept = {k: v for k, v in self._kept.items() if v[0] > now}
                if len(self._kept) >= MAX_CACHED:
                    self._kept.clear()
            self._kept[(token, path)] = (now + ttl, verdict)
        return verdict

    def _decide(self, token: str, path: str) -> Verdict:
        user = reviewed_user(self.review_token(token_review(token)))
        if user is None:
            return Verdict(401, "the API server did not authenticate the token")
        allowed, why = access_allowed(self.review_access(access_review(user, path)))
        name = user.get("username", "?")
        if not allowed:
            return Verdict(403, f"{name} may not get {path}{': ' + why if why else ''}")
        return Verdict(200, f"{name} may get {path}")
