"""The operator's own Kubernetes API requests, counted by verb, resource and answer
(``holmes_api_requests_total``): what it costs the API server, without reading the server's
counters, which mix every client's requests, and which answers it gets (403: RBAC refused a
call; 429: API Priority and Fairness throttles the operator; ``<error>``: no answer at all).

Every request of the kubernetes client in this process goes through
``RESTClientObject.request`` (the writes, the informers' LISTs and WATCHes, the log reads,
the members' clients), so ``install`` counts there. kopf's own requests (its one watch each of
Nodes and HolmesJobs, and the Events it posts) go through its aiohttp session and are not
counted here; handlers.py counts the Events Holmes posts through kopf.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import parse_qs, urlsplit

from kubernetes.client import rest
from prometheus_client import Counter

API_REQUESTS = Counter(
    "holmes_api_requests_total",
    "Kubernetes API requests this operator sent, by verb (GET, LIST, WATCH, POST, PUT, PATCH, "
    "DELETE), resource (plural, /subresource) and code (the HTTP status of the answer, "
    "<error> when none came)",
    ["verb", "resource", "code"],
)
NO_ANSWER = "<error>"  # as client-go's rest_client_requests_total names a request without a status
# /api/v1/... or /apis/GROUP/VERSION/..., then [namespaces/NS/]RESOURCE[/NAME[/SUBRESOURCE]]
_PATH = re.compile(
    r"^/(?:api/[^/]+|apis/[^/]+/[^/]+)(?:/namespaces/[^/]+(?=/))?/([^/]+)(?:/([^/]+)(?:/([^/]+))?)?$"
)


def classify(method: str, url: str, query: list | None = None) -> tuple[str, str]:
    """(verb, resource) of a request as the API server's own metrics name them (a GET of a
    collection is LIST, or WATCH with ``watch=true`` in the URL or ``query``); ("GET",
    "other") for what is not a resource (discovery, /version)."""
    parts = urlsplit(url)
    m = _PATH.match(parts.path)
    if not m:
        return method.upper(), "other"
    resource, name, sub = m.groups()
    verb = method.upper()
    if verb == "GET" and name is None:
        watch = parse_qs(parts.query).get("watch", [""])[0] or dict(query or ()).get("watch", "")
        verb = "WATCH" if str(watch).lower() in ("true", "1") else "LIST"
    return verb, resource + (f"/{sub}" if sub else "")


def answer_code(status: object) -> str:
    """The code label of an answer's HTTP status (``<error>`` when there was none)."""
    return str(status) if isinstance(status, int) and status > 0 else NO_ANSWER


def install() -> None:
    """Count every request of the kubernetes client in this process (once)."""
    request = rest.RESTClientObject.request
    if getattr(request, "_holmes_counted", False):
        return

    @functools.wraps(request)
    def counted(self, method, url, query_params=None, *args, **kwargs):
        verb, resource = classify(method, url, query_params)
        try:
            resp = request(self, method, url, query_params, *args, **kwargs)
        except rest.ApiException as e:  # a non-2xx answer: the client raises it with the status
            API_REQUESTS.labels(verb, resource, answer_code(e.status)).inc()
            raise
        except BaseException:
            API_REQUESTS.labels(verb, resource, NO_ANSWER).inc()
            raise
        API_REQUESTS.labels(verb, resource, answer_code(getattr(resp, "status", None))).inc()
        return resp

    setattr(counted, "_holmes_counted", True)  # noqa: B010 (a mark on a function)
    rest.RESTClientObject.request = counted
