"""The operator's metrics endpoint. Plain: prometheus-client's own HTTP server, to anyone who
reaches the port (a local run, ``make demo``). Secure (``--metrics-secure``, the chart's
default): HTTPS, and only for a bearer token the API server authenticates and authorizes for
``get`` on the path (metrics_auth.py), as controller-runtime serves its metrics. The
certificate comes from ``--metrics-cert-dir`` (tls.crt and tls.key, e.g. a cert-manager
Secret) or, without one, is made self-signed at start (as controller-runtime does): scrapers
then skip verification (the ServiceMonitor's insecureSkipVerify), the token still decides."""

from __future__ import annotations

import http.server
import json
import logging
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
from pathlib import Path

from kubernetes import client
from prometheus_client import REGISTRY, exposition

from .metrics_auth import MetricsAuthorizer, Review

log = logging.getLogger("holmes.operator.metrics")
PATHS = ("/metrics",)  # what is served (and reviewed as a non-resource URL)


def api_reviews(api: client.ApiClient) -> tuple[Review, Review]:
    """TokenReview and SubjectAccessReview creation on the API server, answers as dicts."""
    authn, authz = client.AuthenticationV1Api(api), client.AuthorizationV1Api(api)

    def review_token(body: dict) -> dict:
        resp = authn.create_token_review(body, _preload_content=False, _request_timeout=10)
        return json.loads(resp.data)

    def review_access(body: dict) -> dict:
        resp = authz.create_subject_access_review(body, _preload_content=False, _request_timeout=10)
        return json.loads(resp.data)

    return review_token, review_access


def self_signed(directory: Path, hostname: str = "holmes-operator-metrics") -> tuple[Path, Path]:
    """A fresh self-signed certificate and key (ECDSA P-256, a year) in ``directory``, made by
    the openssl command (the operator image's base has it; Python's ssl cannot make one)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError(
            "--metrics-secure without --metrics-cert-dir needs the openssl command to make a "
            "self-signed certificate: give a certificate (tls.crt, tls.key) with --metrics-cert-dir "
            "(chart: metrics.tls.secretName)"
        )
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "365", "-subj", f"/CN={hostname}", "-addext", f"subjectAltName=DNS:{hostname}",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


class SecureMetricsServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], authorizer: MetricsAuthorizer, ctx: ssl.SSLContext):
        self.authorizer = authorizer
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)
        self.socket = ctx.wrap_socket(self.socket, server_side=True)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: SecureMetricsServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        path = self.path.split("?", 1)[0]
        if path not in PATHS:
            self._answer(404, b"not found\n", "text/plain")
            return
        verdict = self.server.authorizer.check(self.headers.get("Authorization"), path)
        if verdict.status != 200:
            log.log(
                logging.WARNING if verdict.status == 500 else logging.DEBUG,
                "metrics refused: %s",
                verdict.reason,
            )
            self._answer(verdict.status, (verdict.reason + "\n").encode(), "text/plain")
            return
        encoder, content_type = exposition.choose_encoder(self.headers.get("Accept", ""))
        self._answer(200, encoder(REGISTRY), content_type)

    def _answer(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="holmes-operator"')
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        pass  # every scrape would be a line


def serve_secure(
    addr: str, port: int, authorizer: MetricsAuthorizer, cert_dir: str | None = None
) -> SecureMetricsServer:
    """Serve /metrics over HTTPS on a thread of its own; returns the server (``shutdown`` ends it)."""
    if cert_dir:
        cert, key = Path(cert_dir) / "tls.crt", Path(cert_dir) / "tls.key"
    else:
        cert, key = self_signed(Path(tempfile.mkdtemp(prefix="holmes-metrics-tls-")))
    server = SecureMetricsServer((addr, port), authorizer, tls_context(cert, key))
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
