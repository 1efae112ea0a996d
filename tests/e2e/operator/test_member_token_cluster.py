"""`kubectl holmes member-kubeconfig` against the real API server: deploy/member/ makes
no never-expiring token Secret; the TokenRequest API issues the member service account a token
that expires when asked; the kubeconfig around it authenticates as that account, with its
rights and no more."""

from __future__ import annotations

import contextlib
import io

import yaml

from holmes.kubectl_holmes import main
from holmes.operator.core.member_token import claims
from tests.helpers.packaging.packaging_helpers import DEPLOY


def test_the_member_kubeconfig_carries_an_expiring_token_with_the_member_rights(cluster, tmp_path):
    member = str(DEPLOY / "member")
    built = [d for d in yaml.safe_load_all(cluster.kubectl("kustomize", member).stdout) if d]
    assert not [d for d in built if d["kind"] == "Secret"], "deploy/member/ makes no token Secret"
    cluster.kubectl("apply", "-k", member)
    try:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(
                ["member-kubeconfig", "--member", "m", "--duration", "1h", "--kubeconfig", cluster.kubeconfig]
            )
        assert code == 0, err.getvalue()
        cfg = yaml.safe_load(out.getvalue())
        token = cfg["users"][0]["user"]["token"]
        c = claims(token)
        assert c["sub"] == "system:serviceaccount:holmes-system:holmes-member"
        assert c["exp"] - c["iat"] == 3600  # the expiry asked for
        assert "expires" in err.getvalue() and "rotating-the-token" in err.getvalue()

        path = tmp_path / "member.kubeconfig"
        path.write_text(out.getvalue())

        def can_i(*args: str) -> str:
            r = cluster.kubectl("--kubeconfig", str(path), "auth", "can-i", *args, check=False)
            assert "Unauthorized" not in r.stderr, r.stderr
            return r.stdout.strip()

        # kubectl's --kubeconfig given twice: the last one (the member's) wins
        assert can_i("list", "nodes") == "yes"
        assert can_i("create", "pods", "-n", "default") == "yes"
        assert can_i("get", "secrets", "-n", "holmes-system") == "no"
        assert can_i("create", "holmesjobs.holmes.dev", "-n", "default") == "no"
        # a token with its signature altered is refused: the server checks what it issued
        path.write_text(
            out.getvalue().replace(token, token[:-4] + ("AAAA" if token[-4:] != "AAAA" else "BBBB"))
        )
        r = cluster.kubectl("--kubeconfig", str(path), "auth", "can-i", "list", "nodes", check=False)
        assert r.returncode != 0 and "Unauthorized" in r.stderr
    finally:
        cluster.kubectl("delete", "-k", member, "--wait=false", check=False)
