"""holmes_api_requests_total counts each request of the real kubernetes client by verb,
resource and the answer's status (a local HTTP server answers as an API server would: 200,
403 from RBAC, 429 from API Priority and Fairness, no answer at all)."""

from __future__ import annotations

import http.server
import json
import socket
import threading

import pytest
import urllib3
from kubernetes import client
from prometheus_client import REGISTRY

from holmes.operator import api_count

ANSWERS = {
    "/api/v1/namespaces/ok/pods": 200,
    "/api/v1/namespaces/rbac/pods": 403,
    "/api/v1/namespaces/apf/pods": 429,
}


class Answers(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        status = ANSWERS[self.path.split("?")[0]]
        body = json.dumps(
            {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": []}
            if status == 200
            else {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": status}
        ).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def api():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    cfg.retries = 0
    api_count.install()
    try:
        yield client.CoreV1Api(client.ApiClient(cfg))
    finally:
        server.shutdown()
        server.server_close()


def count(code: str) -> float:
    return (
        REGISTRY.get_sample_value(
            "holmes_api_requests_total", {"verb": "LIST", "resource": "pods", "code": code}
        )
        or 0.0
    )


def test_each_answer_is_counted_with_its_status(api):
    before = {c: count(c) for c in ("200", "403", "429")}
    api.list_namespaced_pod("ok")
    for ns in ("rbac", "rbac", "apf"):
        with pytest.raises(client.ApiException):
            api.list_namespaced_pod(ns)
    assert {c: count(c) - before[c] for c in before} == {"200": 1, "403": 2, "429": 1}


def test_no_answer_is_counted_as_error():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = client.Configuration()
    cfg.host, cfg.retries = f"http://127.0.0.1:{port}", 0
    api_count.install()
    before = count("<error>")
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        client.CoreV1Api(client.ApiClient(cfg)).list_namespaced_pod("x")
    assert count("<error>") - before == 1


def test_answer_code():
    assert [api_count.answer_code(s) for s in (200, 429, None, 0)] == ["200", "429", "<error>", "<error>"]
