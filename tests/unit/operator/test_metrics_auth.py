"""Secure metrics serving (holmes.operator.metrics_auth, metrics_server): who may read
/metrics is the API server's TokenReview and SubjectAccessReview answer, as controller-runtime
decides it. The answers below are in the shape the API server returns them
(authentication.k8s.io/v1, authorization.k8s.io/v1; RBAC's reason text as it words it); the
server test runs the real HTTPS server with a self-signed certificate made by openssl."""

from __future__ import annotations

import shutil
import ssl
import urllib.error
import urllib.request

import pytest

from holmes.operator import metrics_auth as ma

PROMETHEUS_TOKEN, OTHER_TOKEN, BAD_TOKEN = "eyJhbGciOiJSUzI1NiJ9.prometheus", "eyJ.other", "not-a-token"
PROMETHEUS_USER = {
    "username": "system:serviceaccount:monitoring:prometheus-k8s",
    "uid": "6b1a1c1e-2f7a-4c55-9f2e-3f6f3b8f9d10",
    "groups": ["system:serviceaccounts", "system:serviceaccounts:monitoring", "system:authenticated"],
    "extra": {
        "authentication.kubernetes.io/pod-name": ["prometheus-k8s-0"],
        "authentication.kubernetes.io/pod-uid": ["0d6a3c2e-8f55-4d0f-a1b2-9c8e7f6a5b4c"],
    },
}
OTHER_USER = {
    "username": "system:serviceaccount:team-a:default",
    "uid": "1f0e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
    "groups": ["system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated"],
}


def token_answer(token: str) -> dict:
    users = {PROMETHEUS_TOKEN: PROMETHEUS_USER, OTHER_TOKEN: OTHER_USER}
    if token not in users:
        return {
            "kind": "TokenReview",
            "apiVersion": "authentication.k8s.io/v1",
            "metadata": {"creationTimestamp": None},
            "spec": {"token": token},
            "status": {"user": {}, "error": "[invalid bearer token, token lookup failed]"},
        }
    return {
        "kind": "TokenReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": {"token": token},
        "status": {
            "authenticated": True,
            "user": users[token],
            "audiences": ["https://kubernetes.default.svc.cluster.local"],
        },
    }


def access_answer(spec: dict) -> dict:
    answer = {"kind": "SubjectAccessReview", "apiVersion": "authorization.k8s.io/v1", "spec": spec}
    rule = spec.get("nonResourceAttributes") == {"path": "/metrics", "verb": "get"}
    if rule and "system:serviceaccounts:monitoring" in spec.get("groups", []):
        answer["status"] = {
            "allowed": True,
            "reason": 'RBAC: allowed by ClusterRoleBinding "prometheus-k8s" of ClusterRole '
            '"prometheus-k8s" to ServiceAccount "prometheus-k8s/monitoring"',
        }
    else:
        answer["status"] = {"allowed": False}  # RBAC denies without a reason
    return answer


class FakeAPI:
    """The two review endpoints, answering as above and recording what they were sent."""

    def __init__(self):
        self.token_reviews: list[dict] = []
        self.access_reviews: list[dict] = []
        self.down = False

    def review_token(self, body):
        self.token_reviews.append(body)
        if self.down:
            raise ConnectionRefusedError("connection refused")
        return token_answer(body["spec"]["token"])

    def review_access(self, body):
        self.access_reviews.append(body)
        return access_answer(body["spec"])


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def api():
    return FakeAPI()


def authorizer(api, clock=None):
    return ma.MetricsAuthorizer(api.review_token, api.review_access, clock or Clock())


def test_no_token_is_401_without_asking(api):
    for header in (None, "", "Basic dXNlcjpwYXNz", "Bearer ", "Bearer"):
        assert authorizer(api).check(header, "/metrics").status == 401
    assert api.token_reviews == []


def test_a_token_the_api_server_does_not_know_is_401(api):
    v = authorizer(api).check(f"Bearer {BAD_TOKEN}", "/metrics")
    assert v.status == 401 and BAD_TOKEN not in v.reason
    assert api.token_reviews == [ma.token_review(BAD_TOKEN)] and api.access_reviews == []


def test_a_user_without_the_rule_is_403(api):
    v = authorizer(api).check(f"Bearer {OTHER_TOKEN}", "/metrics")
    assert v.status == 403 and "system:serviceaccount:team-a:default may not get /metrics" in v.reason


def test_the_access_review_names_the_user_and_the_non_resource_url(api):
    assert authorizer(api).check(f"bearer {PROMETHEUS_TOKEN}", "/metrics").status == 200
    (review,) = api.access_reviews
    assert review["apiVersion"] == "authorization.k8s.io/v1" and review["kind"] == "SubjectAccessReview"
    assert review["spec"] == {
        "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
        "user": PROMETHEUS_USER["username"],
        "uid": PROMETHEUS_USER["uid"],
        "groups": PROMETHEUS_USER["groups"],
        "extra": PROMETHEUS_USER["extra"],
    }


def test_a_denied_answer_wins_over_allowed():
    assert ma.access_allowed({"status": {"allowed": True, "denied": True}}) == (False, "")
    assert ma.access_allowed({}) == (False, "")


def test_answers_are_kept_for_their_ttl(api):
    clock = Clock()
    a = authorizer(api, clock)
    for _ in range(3):
        assert a.check(f"Bearer {PROMETHEUS_TOKEN}", "/metrics").status == 200
        assert a.check(f"Bearer {OTHER_TOKEN}", "/metrics").status == 403
    assert len(api.token_reviews) == 2  # one each
    clock.now += ma.DENY_TTL + 1  # the refusal is asked again (a new binding counts), the allowance not
    a.check(f"Bearer {PROMETHEUS_TOKEN}", "/metrics")
    a.check(f"Bearer {OTHER_TOKEN}", "/metrics")
    assert len(api.token_reviews) == 3
    clock.now += ma.ALLOW_TTL
    a.check(f"Bearer {PROMETHEUS_TOKEN}", "/metrics")
    assert len(api.token_reviews) == 4  # a revoked token stops working within ALLOW_TTL


def test_an_api_server_that_does_not_answer_is_500_and_not_kept(api):
    a = authorizer(api)
    api.down = True
    v = a.check(f"Bearer {PROMETHEUS_TOKEN}", "/metrics")
    assert v.status == 500 and "connection refused" in v.reason
    api.down = False
    assert a.check(f"Bearer {PROMETHEUS_TOKEN}", "/metrics").status == 200


def test_the_cache_is_bounded(api):
    a = authorizer(api)
    for i in range(ma.MAX_CACHED * 2):
        a.check(f"Bearer junk-{i}", "/metrics")
    assert len(a._kept) <= ma.MAX_CACHED


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_https_server_refuses_without_a_token_and_serves_with_one(api, tmp_path):
    from holmes.operator import metrics  # noqa: F401 (registers the operator's metrics)
    from holmes.operator.metrics_server import serve_secure

    server = serve_secure("127.0.0.1", 0, authorizer(api))
    url = f"https://127.0.0.1:{server.server_address[1]}/metrics"
    unverified = ssl.create_default_context()
    unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE  # self-signed

    def get(token=None, ctx=unverified, target=url):
        req = urllib.request.Request(target, headers={"Authorization": f"Bearer {token}"} if token else {})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    try:
        assert get()[0] == 401
        assert get(BAD_TOKEN)[0] == 401
        assert get(OTHER_TOKEN)[0] == 403
        status, body = get(PROMETHEUS_TOKEN)
        assert status == 200 and "holmes_leader" in body
        assert get(PROMETHEUS_TOKEN, target=url.replace("/metrics", "/debug"))[0] == 404
        with pytest.raises(urllib.error.URLError):  # the certificate is no CA's: verifying fails
            get(PROMETHEUS_TOKEN, ctx=ssl.create_default_context())
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no plain HTTP
            urllib.request.urlopen(url.replace("https", "http"), timeout=10)
    finally:
        server.shutdown()
        server.server_close()


def test_the_cert_dir_needs_secure_metrics_and_both_files(tmp_path, capsys):
    from holmes.operator.__main__ import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--metrics-cert-dir", str(tmp_path)])
    assert "add --metrics-secure" in capsys.readouterr().err
    (tmp_path / "tls.crt").write_text("x")
    with pytest.raises(SystemExit):
        parse_args(["--metrics-secure", "--metrics-cert-dir", str(tmp_path)])
    assert "no tls.key there" in capsys.readouterr().err
    (tmp_path / "tls.key").write_text("x")
    assert parse_args(["--metrics-secure", "--metrics-cert-dir", str(tmp_path)]).metrics_secure
