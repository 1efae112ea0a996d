"""The real Kueue on a local control plane (``make kueue-up``; the e2e ``kueue`` fixture).

hack/build-kueue.sh builds ``sigs.k8s.io/kueue``'s manager from its module and renders the
module's own ``config/default`` (``kubectl kustomize``). Here that rendering is applied
server-side without its Deployment (and without the visibility APIService: its server is off),
and the manager runs as a host process of the cluster's state dir:

- its configuration (``<state>/kueue/config.yaml``, :func:`configuration`) enables what Holmes
  relies on: HolmesJob as an external framework (Kueue then treats a HolmesJob's pods as its
  job's, not as pods of their own), WorkloadPriorityClass (always on), ``waitForPodsReady``,
  Topology Aware Scheduling; and not the ``pod`` integration, whose Workload per pod would hold
  the job's quota a second time;
- its ports are picked free per cluster (several clusters run at once on one machine); the
  webhook listens on a non-loopback address of this host (an EndpointSlice may not name a
  loopback address);
- its cert rotator writes the serving certificate into the Secret ``kueue-webhook-server-cert``,
  which a pod would get mounted: here it is copied into the manager's ``certDir``;
- the API server (started with ``--enable-aggregator-routing``) reaches the webhook through
  the webhook Service's endpoints, resolved by itself (no kube-proxy here): a hand-made
  EndpointSlice whose one port is unnamed, as the Service's is.

``up`` is idempotent (a running, answering Kueue is kept); ``down`` stops the manager and takes
away its webhook configurations (every Job create would otherwise fail while it is down).
"""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import yaml
from holmes_dev.kubectl import run_kubectl

from .controlplane import CACHE_BIN, ClusterError, ControlPlane, binary, mentions, pid_alive, stop_pid

CACHE = CACHE_BIN.parent
NAMESPACE = "kueue-system"
SECRET = "kueue-webhook-server-cert"
SERVICE = "kueue-webhook-service"
WEBHOOK_CONFIGS = (
    "mutatingwebhookconfiguration/kueue-mutating-webhook-configuration",
    "validatingwebhookconfiguration/kueue-validating-webhook-configuration",
)
SLICE = "kueue-webhook-service-localkube"
MANAGED_BY = "localkube.holmes.dev"
# The kind Holmes' operator manages Workloads for (integrations.externalFrameworks: Kind.version.group)
HOLMESJOB = "HolmesJob.v1alpha1.holmes.dev"
# Kinds left out of the install: the manager runs as a host process, the visibility server is off.
DROPPED_KINDS = {"Deployment", "APIService"}
PODS_READY_TIMEOUT = os.environ.get("HOLMES_KUEUE_PODS_READY_TIMEOUT", "5m")


def pick_port(host: str) -> int:
    """A port free on ``host`` now (let go at once: the manager binds it moments later; a
    start that loses it to someone else is retried with other ports)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def built_version(name: str) -> str | None:
    """The release hack/build-kueue.sh recorded for ``name`` in bin/.versions (None: not built)."""
    try:
        lines = (CACHE_BIN / ".versions").read_text().splitlines()
    except OSError:
        return None
    return next((ln.split()[1] for ln in lines if len(ln.split()) == 2 and ln.split()[0] == name), None)


def manifests_path() -> Path:
    version = built_version("kueue-manifests")
    path = CACHE / "kueue" / str(version) / "manifests.yaml"
    if not version or not path.exists() or not built_version("kueue"):
        raise ClusterError(
            f"Kueue is not built in {CACHE}: run `bash hack/build-kueue.sh` "
            "(or `make kueue-up`, which runs it)"
        )
    return path


def host_address() -> str:
    """A global IPv4 address of this host: the webhook's endpoint (the API server dials it)."""
    r = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True)
    for line in r.stdout.splitlines():
        parts = line.split()
        if "inet" in parts:
            return parts[parts.index("inet") + 1].split("/")[0]
    raise ClusterError(
        "this host has no global IPv4 address for Kueue's webhook (the API server dials it through "
        "an EndpointSlice, which may not name a loopback address); `ip -4 addr` shows none"
    )


# Holmes' integration settings (see the module's docstring); a test may run Kueue with others,
# e.g. Kueue's own defaults, to show what goes wrong with them.
INTEGRATIONS = {
    # batch/job as Kueue's own example, JobSet (make jobset-up) for the JobSets that ask for
    # Holmes' island level; never "pod" (each of a HolmesJob's pods would get a Workload of its
    # own beside the job's: its quota counted twice)
    "frameworks": ["batch/job", "jobset.x-k8s.io/jobset"],
    "externalFrameworks": [HOLMESJOB],
}


def configuration(
    cert_dir: Path,
    webhook_host: str,
    webhook_port: int,
    health_port: int,
    integrations: dict | None = None,
    pods_ready_timeout: str = PODS_READY_TIMEOUT,
    multikueue: bool = False,
) -> dict:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for the host process; with
    ``multikueue`` a MultiKueue manager that dispatches HolmesJobs (its generic adapter for
    outside kinds, feature gate MultiKueueAdaptersForCustomJobs, on by default since v0.15)."""
    cfg = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},  # off: nothing scrapes it here
        "webhook": {"host": webhook_host, "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": SERVICE,
            "webhookSecretName": SECRET,
        },
        "clientConnection": {"qps": 50, "burst": 100},
        # Evicts a Workload whose PodsReady condition is not True this long after admission.
        "waitForPodsReady": {
            "timeout": pods_ready_timeout,
            "blockAdmission": False,
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 10, "backoffMaxSeconds": 60},
        },
        "integrations": INTEGRATIONS if integrations is None else integrations,
        "featureGates": {"TopologyAwareScheduling": True, "VisibilityOnDemand": False},
    }
    if multikueue:
        cfg["multiKueue"] = {"externalFrameworks": [{"name": HOLMESJOB}]}
    return cfg


def install_objects(text: str) -> tuple[list[dict], list[dict]]:
    """Kueue's rendered manifests as (CRDs, the rest), without DROPPED_KINDS."""
    crds, rest = [], []
    # libyaml where PyYAML has it: 1.7 MB of CRDs parse in under a second, not five
    for doc in yaml.load_all(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        if not doc or doc.get("kind") in DROPPED_KINDS:
            continue
        (crds if doc.get("kind") == "CustomResourceDefinition" else rest).append(doc)
    return crds, rest


def default_integrations() -> dict:
    """The integrations of Kueue's own default configuration (its config map as built): the
    pod integration on, no external framework."""
    for doc in install_objects(manifests_path().read_text())[1]:
        if doc["kind"] == "ConfigMap" and "controller_manager_config.yaml" in (doc.get("data") or {}):
            return yaml.safe_load(doc["data"]["controller_manager_config.yaml"])["integrations"]
    raise ClusterError("Kueue's manifests have no config map with controller_manager_config.yaml")


def kueue_crds() -> list[str]:
    """The names of Kueue's CRDs (as built)."""
    return [c["metadata"]["name"] for c in install_objects(manifests_path().read_text())[0]]


class Kueue:
    """The real Kueue of one local cluster (``ControlPlane``)."""

    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self.dir = cp.dir / "kueue"
        self.cert_dir = self.dir / "certs"
        self.config = self.dir / "config.yaml"
        self.log_path = cp.dir / "logs" / "kueue.log"

    # ---- helpers -------------------------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120):
        r = run_kubectl(binary("kubectl"), str(self.cp.kubeconfig), *args, input=input, timeout=timeout)
        if check and r.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args[:3])} ... failed: {r.stderr.strip()[-1500:]}")
        return r

    def _state(self) -> dict:
        return self.cp.state().get("kueue") or {}

    def pid(self) -> int | None:
        pid = self.cp.state().get("pids", {}).get("kueue")
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
        probe = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "localkube-probe"},
        }
        r = self.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False)
        return r.returncode == 0

    def _tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    # ---- start ---------------------------------------------------------------------------
    def up(
        self,
        log=print,
        timeout: float = 180,
        integrations: dict | None = None,
        pods_ready_timeout: str | None = None,
        multikueue: bool = False,
    ) -> dict:
        """Install and start Kueue (kept when it runs with the same ``integrations``, None for
        INTEGRATIONS, and waitForPodsReady timeout, None for PODS_READY_TIMEOUT: a test may
        start it with a short one to provoke the eviction)."""
        integrations = INTEGRATIONS if integrations is None else integrations
        pods_ready_timeout = pods_ready_timeout or PODS_READY_TIMEOUT
        if not self.cp.running():
            raise ClusterError(f"the cluster of {self.cp.dir} is not running: `make cluster-up` first")
        kueue_bin = binary("kueue")
        manifests = manifests_path()
        wanted = {
            "integrations": integrations,
            "podsReadyTimeout": pods_ready_timeout,
            "multikueue": multikueue,
        }
        running = self.running()
        have = {"multikueue": False, **self._state()}  # a state written before the option: off
        if running and all(have.get(k) == v for k, v in wanted.items()):
            log(f"kueue {built_version('kueue')} already running (pid {self.pid()})")
            return self._state()
        # the same Kueue running (its manifests applied, its webhooks answering) restarts with
        # another configuration only: its objects are not applied again
        installed = running and self._state().get("version") == built_version("kueue")
        self.down(log=lambda *_: None, keep_webhooks=True)
        t0 = time.monotonic()
        if not installed:
            self._install(manifests, log)

        self.dir.mkdir(parents=True, exist_ok=True)
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        for f in self.cert_dir.iterdir():
            f.unlink()
        host = host_address()
        for tries in range(3, 0, -1):
            try:
                self._start(kueue_bin, host, integrations, pods_ready_timeout, log, timeout, multikueue)
                break
            except ClusterError as e:
                self.down(log=lambda *_: None, keep_webhooks=True)
                if "address already in use" not in str(e) or tries == 1:
                    self.down(log=lambda *_: None)
                    raise
                log("a port was taken before kueue bound it: starting it again on others")
            except BaseException:
                self.down(log=lambda *_: None)
                raise
        log(f"kueue up in {time.monotonic() - t0:.1f}s (log {self.log_path})")
        return self._state()

    def _install(self, manifests: Path, log) -> None:
        crds, rest = install_objects(manifests.read_text())
        log(
            f"installing Kueue {built_version('kueue-manifests')}: {len(crds)} CRDs, "
            f"{len(rest)} other objects"
        )
        self._apply(crds)
        self.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            *(f"crd/{c['metadata']['name']}" for c in crds),
        )
        self._apply(rest)

    def _start(
        self,
        kueue_bin: str,
        host: str,
        integrations: dict,
        pods_ready_timeout: str,
        log,
        timeout: float,
        multikueue: bool = False,
    ) -> None:
        webhook_port, health_port = pick_port(host), pick_port("127.0.0.1")
        cfg = configuration(
            self.cert_dir, host, webhook_port, health_port, integrations, pods_ready_timeout, multikueue
        )
        self.config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self._endpoint_slice(host, webhook_port)

        st = self.cp.state()
        st["kueue"] = {
            "version": built_version("kueue"),
            "webhook": f"{host}:{webhook_port}",
            "healthPort": health_port,
            "config": str(self.config),
            "integrations": integrations,
            "podsReadyTimeout": pods_ready_timeout,
            "multikueue": multikueue,
        }
        self.cp._save(st)
        log(f"starting kueue (webhook on {host}:{webhook_port}, health on 127.0.0.1:{health_port})")
        self.cp._spawn(
            st,
            "kueue",
            [kueue_bin, f"--config={self.config}", f"--kubeconfig={self.cp.kubeconfig}", "--zap-log-level=2"],
        )
        self._wait_certificate(timeout)
        self._wait("the API server to reach Kueue's webhooks", self._webhook_answers, timeout)

    def _apply(self, objs: list[dict]) -> None:
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
        self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=localkube-kueue",
            "-f",
            "-",
            input=body,
        )

    def _endpoint_slice(self, host: str, port: int) -> None:
        """The webhook Service's endpoint: this host's process. Unnamed port, as the Service's."""
        eps = {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": SLICE,
                "namespace": NAMESPACE,
                "labels": {
                    "kubernetes.io/service-name": SERVICE,
                    "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
                },
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [host], "conditions": {"ready": True}}],
            "ports": [{"port": port, "protocol": "TCP"}],
        }
        self._apply([eps])

    def _wait(self, what: str, ok, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ok():
                return
            if self.pid() is None:
                raise ClusterError(f"kueue exited while starting; log tail:\n{self._tail()}")
            time.sleep(0.5)
        raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}; log tail:\n{self._tail()}")

    def _wait_certificate(self, timeout: float) -> None:
        """Copy the cert rotator's Secret into certDir (what mounting it in a pod would do)."""

        def copied() -> bool:
            r = self.kubectl("get", "secret", SECRET, "-n", NAMESPACE, "-o", "json", check=False)
            if r.returncode != 0:
                return False
            data = json.loads(r.stdout).get("data") or {}
            if not data.get("tls.crt") or not data.get("tls.key"):
                return False
            for key, value in data.items():
                path = self.cert_dir / key
                path.write_bytes(base64.b64decode(value))
                path.chmod(0o600)
            return True

        self._wait("Kueue's cert rotator to write Secret kueue-system/" + SECRET, copied, timeout)

    def uninstall(self, timeout: float = 120) -> None:
        """Stop Kueue and delete its CRDs, with every object of its kinds (the finalizers Kueue
        would have removed, such as a Workload's resource-in-use, taken off by hand)."""
        self.down(log=lambda *_: None)
        crds = [f"crd/{c}" for c in kueue_crds()]
        self.kubectl("delete", *crds, "--ignore-not-found", "--wait=false", check=False)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            left = self.kubectl("get", *crds, "-o", "name", "--ignore-not-found", check=False).stdout.split()
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
        raise ClusterError(f"Kueue's CRDs still there {timeout:.0f}s after their deletion: {left}")

    # ---- stop ----------------------------------------------------------------------------
    def down(self, log=print, grace: float = 10.0, keep_webhooks: bool = False) -> None:
        """Stop the manager; unless ``keep_webhooks``, remove its webhook configurations and
        endpoint (objects of Kueue's kinds stay, refused nothing once the webhooks are gone)."""
        pid = self.pid()
        if pid is not None:
            log(f"stopping kueue (pid {pid})")
            stop_pid(pid, grace)
        st = self.cp.state()
        if st.get("pids", {}).pop("kueue", None) is not None or "kueue" in st:
            st.pop("kueue", None)
            self.cp._save(st)
        if not keep_webhooks and self.cp.running():
            self.kubectl("delete", *WEBHOOK_CONFIGS, "--ignore-not-found", check=False)
            self.kubectl("delete", "endpointslice", SLICE, "-n", NAMESPACE, "--ignore-not-found", check=False)
