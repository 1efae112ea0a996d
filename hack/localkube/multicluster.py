"""Several local control planes at once: one per cluster of a topology (``make multicluster-up``).

The topology's nodes are split by their ``cluster`` (the default topology: ``east`` with the
InfiniBand nodes, ``west`` with the RoCE nodes); each part gets its own control plane and node
agent in ``<root>/<cluster>/`` (a ``ControlPlane`` state dir). Every agent puts its pods on one
bridge, each in its own /24 of the pod subnet (podnet.py), so pods of two clusters reach each
other by pod IP (the "routable pod network" a job across clusters needs). The first cluster
doubles as the hub, where the operator and the HolmesJobs live; ``register`` makes every cluster
a member of it (a Secret labelled ``holmes.dev/member-cluster`` holding that cluster's
kubeconfig, in the hub's members namespace).

    <root>/multicluster.json     the members, the hub, the topology
    <root>/<member>/             a ControlPlane state dir (kubeconfig, logs, pods, ...)
    <root>/<member>.yaml         that member's part of the topology
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import yaml
from holmes_dev.kubectl import run_kubectl

from .controlplane import REPO, ClusterError, ControlPlane, binary, pick_ports
from .topology import load_topology

STATE = "multicluster.json"
MEMBERS_NAMESPACE = "holmes-system"
MEMBER_LABEL = "holmes.dev/member-cluster"


def split_topology(path: str | Path) -> dict[str, dict]:
    """The topology's nodes by cluster, each part a topology document of its own."""
    doc = yaml.safe_load(Path(path).read_text())
    load_topology(path)  # validates
    parts: dict[str, dict] = {}
    for node in doc["nodes"]:
        part = parts.setdefault(
            str(node["cluster"]),
            {
                "defaults": doc.get("defaults") or {},
                "nodes": [],
                **({"kwok": doc["kwok"]} if "kwok" in doc else {}),
            },
        )
        part["nodes"].append(node)
    if len(parts) < 2:
        raise ClusterError(
            f"{path}: its nodes are all in one cluster; a multi-cluster set-up needs two or more"
        )
    return parts


class MultiCluster:
    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    def state(self) -> dict:
        try:
            return json.loads((self.root / STATE).read_text())
        except (OSError, ValueError):
            return {}

    def plane(self, member: str) -> ControlPlane:
        return ControlPlane(self.root / member)

    @property
    def members(self) -> list[str]:
        return list(self.state().get("members") or [])

    @property
    def hub(self) -> str:
        return self.state().get("hub") or ""

    def kubeconfig(self, member: str) -> Path:
        return self.plane(member).kubeconfig

    def up(self, topology: str | Path, log=print) -> dict:
        """Start one control plane per cluster of the topology (idempotent per member)."""
        topology = str(Path(topology).resolve())
        parts = split_topology(topology)
        self.root.mkdir(parents=True, exist_ok=True)
        st = {"topology": topology, "members": sorted(parts), "hub": sorted(parts)[0]}
        (self.root / STATE).write_text(json.dumps(st, indent=2))
        for member in sorted(parts):
            cp = self.plane(member)
            cp.dir.mkdir(parents=True, exist_ok=True)
            part = self.root / f"{member}.yaml"
            text = yaml.safe_dump(parts[member], sort_keys=False)
            if not part.exists() or part.read_text() != text:
                part.write_text(text)
            if cp.running():  # its agent owns its pod-IP octet: the next member picks another
                log(f"member {member}: already running")
                continue
            log(f"member {member}: starting its control plane ({len(parts[member]['nodes'])} nodes)")
            try:
                cp.up(part, port_base=pick_ports(None), log=lambda m, member=member: log(f"  [{member}] {m}"))
            except BaseException:
                self.down(log=lambda *_: None)
                raise
        return st

    def down(self, log=print) -> None:
        for member in self.members or [d.name for d in self.root.glob("*") if (d / "cluster.json").exists()]:
            cp = self.plane(member)
            if cp.state().get("pids"):
                log(f"member {member}: stopping")
                cp.down(log=lambda m, member=member: log(f"  [{member}] {m}"))

    def kubectl(self, member: str, *args: str, input: str | None = None, check: bool = True) -> str:
        r = run_kubectl(binary("kubectl"), str(self.kubeconfig(member)), *args, input=input)
        if check and r.returncode:
            raise ClusterError(f"kubectl {' '.join(args)} on {member} failed: {r.stderr.strip()}")
        return r.stdout

    def member_kubeconfig(self, member: str) -> bytes:
        """A kubeconfig for the hub's operator with only the member side's rights: applies
        deploy/member/ (a service account and the ClusterRole) and issues that account a token
        that expires, as docs/multicluster.md tells an admin to do (`kubectl holmes
        member-kubeconfig`). A day: longer than any test or demo."""
        from kubernetes import client as k8s
        from kubernetes import config

        from holmes.kubectl_holmes import PluginError, issue_member_token
        from holmes.operator.core import member_token

        self.kubectl(member, "apply", "-k", str(REPO / "deploy" / "member"))
        api = config.new_client_from_config(str(self.kubeconfig(member)))
        end = time.monotonic() + 30
        while True:  # the service account was just created: the API may not serve it yet
            try:
                token = issue_member_token(k8s, api, "holmes-system", "holmes-member", 24 * 3600)
                break
            except PluginError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.2)
        admin = json.loads(self.kubeconfig(member).read_text())
        cluster = admin["clusters"][0]["cluster"]
        cfg = member_token.kubeconfig(member, cluster["server"], None, token, "holmes-member")
        cfg["clusters"][0]["cluster"] = cluster  # its CA as the admin's kubeconfig gives it
        return yaml.safe_dump(cfg).encode()

    def register(
        self, namespace: str = MEMBERS_NAMESPACE, members: list[str] | None = None, admin: bool = False
    ) -> None:
        """Make each member known to the hub: a Secret with its kubeconfig in ``namespace``
        (the member side's service account, or with ``admin`` the cluster admin's)."""
        hub = self.hub
        self.kubectl(hub, "create", "namespace", namespace, check=False)
        for member in members if members is not None else self.members:
            kubeconfig = self.kubeconfig(member).read_bytes() if admin else self.member_kubeconfig(member)
            secret = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": f"member-{member}",
                    "namespace": namespace,
                    "labels": {MEMBER_LABEL: member},
                },
                "data": {"kubeconfig": base64.b64encode(kubeconfig).decode()},
            }
            self.kubectl(hub, "apply", "-f", "-", input=json.dumps(secret))

    def ensure_namespace(self, namespace: str) -> None:
        """The namespace in every member (a job's children go to the job's namespace there)."""
        for member in self.members:
            if not self.kubectl(member, "get", "namespace", namespace, "--ignore-not-found", "-o", "name"):
                self.kubectl(member, "create", "namespace", namespace)
            end = time.monotonic() + 30  # pods are refused until its default service account exists
            while not self.kubectl(
                member,
                "get",
                "serviceaccount",
                "default",
                "-n",
                namespace,
                "-o",
                "jsonpath={.metadata.name}",
                check=False,
            ).strip():
                if time.monotonic() > end:
                    raise ClusterError(f"{member}: namespace {namespace} has no default service account")
                time.sleep(0.2)
