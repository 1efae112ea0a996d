"""Member registrations read by name (``--member-secret``), against the real API server: a
service account granted get/list/watch on exactly those Secrets (RBAC resourceNames, as the
chart's ``members.secretNames`` renders it) lists and watches them, and never sees the
namespace's other Secrets."""

from __future__ import annotations

import time

import yaml
from kubernetes import client, config

from holmes.operator.member_clusters import LABEL_MEMBER_CLUSTER, MemberRegistry


def sa_api(cluster, ns: str, name: str) -> client.ApiClient:
    """An API client authenticated as ``ns``'s service account ``name`` (a token from the
    TokenRequest API: since 1.24 no token Secret is made for a service account)."""
    end = time.monotonic() + 30
    while cluster.kubectl("get", "sa", name, "-n", ns, check=False).returncode != 0:
        assert time.monotonic() < end, f"service account {ns}/{name} never appeared"
        time.sleep(0.2)
    token = cluster.kubectl("create", "token", name, "-n", ns).stdout.strip()
    admin = client.Configuration()
    config.load_kube_config(config_file=cluster.kubeconfig, client_configuration=admin)
    cfg = client.Configuration()  # the server and its CA only: no admin credential carried over
    cfg.host, cfg.ssl_ca_cert, cfg.verify_ssl = admin.host, admin.ssl_ca_cert, admin.verify_ssl
    cfg.api_key = {"authorization": "Bearer " + token}
    return client.ApiClient(cfg)


def member_secret(name: str, member: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "labels": {LABEL_MEMBER_CLUSTER: member}},
            "stringData": {"kubeconfig": "not: a kubeconfig"},
        }
    )


def test_registry_reads_only_the_named_secrets_with_resource_names_rbac(cluster, namespace):
    ns = namespace
    for name, member in (("member-b", "b"), ("member-c", "c"), ("unnamed", "x")):
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=member_secret(name, member))
    cluster.kubectl("create", "serviceaccount", "hub", "-n", ns)
    cluster.kubectl(
        "create",
        "role",
        "hub-members",
        "-n",
        ns,
        "--verb=get,list,watch",
        "--resource=secrets",
        "--resource-name=member-b",
        "--resource-name=member-c",
    )
    cluster.kubectl(
        "create", "rolebinding", "hub-members", "-n", ns, "--role=hub-members", f"--serviceaccount={ns}:hub"
    )
    core = client.CoreV1Api(sa_api(cluster, ns, "hub"))
    # what resourceNames allows: not the namespace's Secrets as a whole
    try:
        core.list_namespaced_secret(ns)
        raise AssertionError("listing every Secret was allowed")
    except client.ApiException as e:
        assert e.status == 403

    registry = MemberRegistry(
        core, ns, lambda *a: None, dict, lambda n: (), secret_names=("member-b", "member-c")
    ).start()
    try:
        for informer in registry.informers:
            assert informer.synced.wait(30), f"{informer.kind} never listed"
        seen = sorted(s["metadata"]["name"] for store in registry.stores for s in store.values())
        assert seen == ["member-b", "member-c"]
        # a watch by name sees its Secret go
        cluster.kubectl("delete", "secret", "member-c", "-n", ns)
        end = time.monotonic() + 20
        while any(s["metadata"]["name"] == "member-c" for store in registry.stores for s in store.values()):
            assert time.monotonic() < end, "the deleted member-c stayed in the registry's stores"
            time.sleep(0.1)
    finally:
        registry.stop()
