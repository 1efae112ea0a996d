"""A controller manager run as a host process of a local cluster, its webhooks reached by the API
server: what :mod:`localkube.kueue`, :mod:`localkube.jobset` and :mod:`localkube.kftrainer` share.

A project's own rendered manifests are applied server-side without its Deployment; the manager
runs with a configuration file of ours (leader election and metrics off, ports picked free, the
webhook on a global address of this host: an EndpointSlice may not name a loopback one). What a
pod would get and a host process does not is done by hand:

- the cert rotator writes the serving certificate into a Secret a pod would get mounted: it is
  copied into the manager's ``certDir`` (and into ``extra_cert_dirs``);
- the API server (started with ``--enable-aggregator-routing``, there being no kube-proxy) reaches
  the webhook Service through its endpoints, resolved by itself: a hand-made EndpointSlice whose
  one port is unnamed, as the Service's is (one named "https" gave "no endpoints available").

A subclass names its objects (class attributes) and gives :meth:`configuration` and
:meth:`probe` (an object whose server-side dry run passes its webhooks).
"""

from __future__ import annotations

import base64
import json
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import yaml
from holmes_dev.kubectl import run_kubectl

from .controlplane import (
    CACHE_BIN,
    ClusterError,
    ControlPlane,
    binary,
    built_version,
    mentions,
    pid_alive,
    stop_pid,
)

CACHE = CACHE_BIN.parent
MANAGED_BY = "localkube.holmes.dev"
# Kinds left out of the install: the manager runs as a host process; Kueue's visibility server is off.
DROPPED_KINDS = {"Deployment", "APIService"}


def pick_port(host: str) -> int:
    """A port free on ``host`` now (let go at once: the manager binds it moments later; a
    start that loses it to someone else is retried with other ports)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def host_address() -> str:
    """A global IPv4 address of this host: the webhook's endpoint (the API server dials it)."""
    r = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            return parts[parts.index("inet") + 1].split("/")[0]
    raise ClusterError(
        "this host has no global IPv4 address for the webhooks (the API server dials them through "
        "an EndpointSlice, which may not name a loopback address); `ip -4 addr` shows none"
    )


def install_objects(text: str) -> tuple[list[dict], list[dict]]:
    """Rendered manifests as (CRDs, the rest), without DROPPED_KINDS."""
    crds, rest = [], []
    # libyaml where PyYAML has it: 1.7 MB of CRDs parse in under a second, not five
    for doc in yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        if not doc or doc.get("kind") in DROPPED_KINDS:
            continue
        (crds if doc.get("kind") == "CustomResourceDefinition" else rest).append(doc)
    return crds, rest


def manifests_path(piece: str, binary_name: str, what: str, build: str, up: str = "") -> Path:
    """The rendered manifests hack/build-*.sh cached for ``piece`` (``<piece>-manifests`` in
    bin/.versions), or a ClusterError saying how to build them (``make <up>``, by default
    ``<piece>-up``, runs the build)."""
    version = built_version(f"{piece}-manifests")
    path = CACHE / piece / str(version) / "manifests.yaml"
    if not version or not path.exists() or not built_version(binary_name):
        raise ClusterError(
            f"{what} is not built in {CACHE}: run `bash hack/{build}` "
            f"(or `make {up or piece + '-up'}`, which runs it)"
        )
    return path


class HostController:
    """One project's controller manager on one local cluster (``ControlPlane``)."""

    name = ""  # its key in cluster.json's pids and state, its log's and state dir's name
    title = ""  # in messages: "Kueue", "JobSet"
    namespace = ""
    secret = ""  # the cert rotator's Secret
    service = ""  # the webhook Service
    slice_name = ""  # the hand-made EndpointSlice
    webhook_configs: tuple[str, ...] = ()
    extra_cert_dirs: tuple[Path, ...] = ()  # where else the certificate must be (JobSet's rotator)
    # the webhook Service port's name: the API server picks the slice's port by it (None: unnamed)
    slice_port_name: str | None = None

    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self.dir = cp.dir / self.name
        self.cert_dir = self.dir / "certs"
        self.config = self.dir / "config.yaml"
        self.log_path = cp.dir / "logs" / f"{self.name}.log"

    # ---- the subclass's part ---------------------------------------------------------------
    def configuration(self, webhook_host: str, webhook_port: int, health_port: int) -> dict:
        raise NotImplementedError

    def probe(self) -> dict:
        """An object whose server-side dry run the webhooks must pass."""
        raise NotImplementedError

    def command(self, manager: str) -> list[str]:
        return [manager, f"--config={self.config}", f"--kubeconfig={self.cp.kubeconfig}", "--zap-log-level=2"]

    def state_fields(self, health_port: int) -> dict:
        """More of what ``cluster.json`` records for the running manager."""
        return {}

    # ---- helpers -------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120):
        r = run_kubectl(binary("kubectl"), str(self.cp.kubeconfig), *args, input=input, timeout=timeout)
        if check and r.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args[:3])} ... failed: {r.stderr.strip()[-1500:]}")
        return r

    def _state(self) -> dict:
        return self.cp.state().get(self.name) or {}

    def pid(self) -> int | None:
        pid = self.cp.state().get("pids", {}).get(self.name)
        return pid if pid_alive(pid) and mentions(pid, self.cp.dir) else None

    def running(self) -> bool:
        """The manager runs and the API server reaches its webhooks."""
        for _ in range(3):  # a loaded machine's API server may miss one call
            if self.pid() is None:
                return False
            if self._webhook_answers():
                return True
            time.sleep(1)
        return False

    def _webhook_answers(self) -> bool:
        r = self.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(self.probe()), check=False)
        return r.returncode == 0

    def _tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    # ---- install and start -------------------------------------------------------------------
    def install(self, manifests: Path, log, what: str, later: frozenset[str] = frozenset()) -> list[dict]:
        """Apply the rendered manifests: the CRDs, once established the rest, but for the objects
        of the kinds ``later`` (objects its own webhooks admit: applied once it runs), returned."""
        crds, rest = install_objects(manifests.read_text())
        held = [o for o in rest if o.get("kind") in later]
        rest = [o for o in rest if o.get("kind") not in later]
        log(f"installing {what}: {len(crds)} CRDs, {len(rest) + len(held)} other objects")
        self._apply(crds)
        names = [c["metadata"]["name"] for c in crds]
        # polled: `kubectl wait` fails outright on a CRD created so recently it has no status yet
        self._wait(
            f"{self.title}'s CRDs to be established", lambda: self._established(names), 60, started=False
        )
        self._apply(rest)
        return held

    def start(self, manager: str, log, timeout: float) -> None:
        """Start the manager (cert dirs emptied first); a port taken before it bound it: again on
        others, twice at most. A failed start leaves nothing running and no webhooks."""
        for d in (self.cert_dir, *self.extra_cert_dirs):
            d.mkdir(parents=True, exist_ok=True)
            for f in d.iterdir():
                f.unlink(missing_ok=True)
        host = host_address()
        for tries in range(3, 0, -1):
            try:
                self._start(manager, host, log, timeout)
                return
            except ClusterError as e:
                self.down(log=lambda *_: None, keep_webhooks=True)
                if "address already in use" not in str(e) or tries == 1:
                    self.down(log=lambda *_: None)
                    raise
                log(f"a port was taken before {self.name} bound it: starting it again on others")
            except BaseException:
                self.down(log=lambda *_: None)
                raise

    def _start(self, manager: str, host: str, log, timeout: float) -> None:
        webhook_port, health_port = pick_port(host), pick_port("127.0.0.1")
        cfg = self.configuration(host, webhook_port, health_port)
        self.config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self._endpoint_slice(host, webhook_port)
        st = self.cp.state()
        st[self.name] = {
            "version": built_version(Path(manager).name),
            "webhook": f"{host}:{webhook_port}",
            **self.state_fields(health_port),
        }
        self.cp._save(st)
        log(f"starting {self.name} (webhook on {host}:{webhook_port}, health on 127.0.0.1:{health_port})")
        self.cp._spawn(st, self.name, self.command(manager))
        self._wait_certificate(timeout)
        self._wait(f"the API server to reach {self.title}'s webhooks", self._webhook_answers, timeout)

    def _apply(self, objs: list[dict]) -> None:
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
        self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            f"--field-manager=localkube-{self.name}",
            "-f",
            "-",
            input=body,
        )

    def _endpoint_slice(self, host: str, port: int) -> None:
        """The webhook Service's endpoint: this host's process; its port named as the Service's."""
        eps = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": self.slice_name,
                "namespace": self.namespace,
                "labels": {
                    "kubernetes.io/service-name": self.service,
                    "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
            "ports": [
                {
                    "port": port,
                    "protocol": "TCP",
                    **({"name": self.slice_port_name} if self.slice_port_name else {}),
                }
            ],
        }
        self._apply([eps])

    def _established(self, crds: list[str]) -> bool:
        for crd in crds:
            r = self.kubectl("get", "crd", crd, "-o", "json", check=False)
            conds = (
                (json.loads(r.stdout).get("status") or {}).get("conditions") or []
                if r.returncode == 0
                else []
            )
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                return False
        return True

    def _wait(self, what: str, ok: Callable[[], bool], timeout: float, started: bool = True) -> None:
        """Poll ``ok`` for ``timeout`` seconds; ``started``: the manager runs (its exit ends the wait)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ok():
                return
            if started and self.pid() is None:
                raise ClusterError(f"{self.name} exited while starting; log tail:\n{self._tail()}")
            time.sleep(0.5)
        raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}; log tail:\n{self._tail()}")

    def _wait_certificate(self, timeout: float) -> None:
        """Copy the cert rotator's Secret into certDir and extra_cert_dirs (what mounting it in a
        pod would do)."""

        def copied() -> bool:
            r = self.kubectl("get", "secret", self.secret, "-n", self.namespace, "-o", "json", check=False)
            data = (json.loads(r.stdout).get("data") or {}) if r.returncode == 0 else {}
            if not data.get("tls.crt") or not data.get("tls.key"):
                return False
            for d in (self.cert_dir, *self.extra_cert_dirs):
                d.mkdir(parents=True, exist_ok=True)
                for key, value in data.items():
                    path = d / key
                    path.write_bytes(base64.b64decode(value))
                    path.chmod(0o600)
            return True

        self._wait(
            f"{self.title}'s cert rotator to write Secret {self.namespace}/{self.secret}", copied, timeout
        )

    def delete_crds(self, crds: list[str], timeout: float = 120) -> None:
        """Delete CRDs with every object of their kinds, taking off the finalizers the stopped
        manager would have removed (a runtime's resource-in-use, a Workload's)."""
        names = [f"crd/{c}" for c in crds]
        self.kubectl("delete", *names, "--ignore-not-found", "--wait=false", check=False)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            left = self.kubectl("get", *names, "-o", "name", "--ignore-not-found", check=False).stdout.split()
            if not left:
                return
            for crd in left:
                resource = crd.split("/", 1)[1]
                r = self.kubectl("get", resource, "-A", "-o", "json", check=False)
                for o in json.loads(r.stdout).get("items", []) if r.returncode == 0 else []:
                    if o["metadata"].get("finalizers"):
                        ns = o["metadata"].get("namespace")
                        self.kubectl(
                            "patch",
                            resource,
                            o["metadata"]["name"],
                            *(["-n", ns] if ns else []),
                            "--type=merge",
                            "-p",
                            '{"metadata":{"finalizers":null}}',
                            check=False,
                        )
            time.sleep(1)
        raise ClusterError(f"{self.title}'s CRDs still there {timeout:.0f}s after their deletion: {left}")

    # ---- stop ----------------------------------------------------------------------------
    def down(self, log=print, grace: float = 10.0, keep_webhooks: bool = False) -> None:
        """Stop the manager; unless ``keep_webhooks``, remove its webhook configurations and
        endpoint (objects of its kinds stay, refused nothing once the webhooks are gone)."""
        pid = self.pid()
        if pid is not None:
            log(f"stopping {self.name} (pid {pid})")
            stop_pid(pid, grace)
        st = self.cp.state()
        if st.get("pids", {}).pop(self.name, None) is not None or self.name in st:
            st.pop(self.name, None)
            self.cp._save(st)
        if not keep_webhooks and self.cp.running():
            self.kubectl("delete", *self.webhook_configs, "--ignore-not-found", check=False)
            self.kubectl(
                "delete",
                "endpointslice",
                self.slice_name,
                "-n",
                self.namespace,
                "--ignore-not-found",
                check=False,
            )
