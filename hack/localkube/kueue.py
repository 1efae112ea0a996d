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

import os
import time
from pathlib import Path

import yaml

from .controller import HostController, built_version, install_objects
from .controller import manifests_path as _manifests_path
from .controlplane import ClusterError, binary

NAMESPACE = "kueue-system"
SECRET = "kueue-webhook-server-cert"
SERVICE = "kueue-webhook-service"
WEBHOOK_CONFIGS = (
    "mutatingwebhookconfiguration/kueue-mutating-webhook-configuration",
    "validatingwebhookconfiguration/kueue-validating-webhook-configuration",
)
SLICE = "kueue-webhook-service-localkube"
# The kind Holmes' operator manages Workloads for (integrations.externalFrameworks: Kind.version.group)
HOLMESJOB = "HolmesJob.v1alpha1.holmes.dev"
PODS_READY_TIMEOUT = os.environ.get("HOLMES_KUEUE_PODS_READY_TIMEOUT", "5m")


def manifests_path() -> Path:
    return _manifests_path("kueue", "kueue", "Kueue", "build-kueue.sh")


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


class Kueue(HostController):
    """The real Kueue of one local cluster (``ControlPlane``)."""

    name, title = "kueue", "Kueue"
    namespace, secret, service, slice_name = NAMESPACE, SECRET, SERVICE, SLICE
    webhook_configs = WEBHOOK_CONFIGS
    # what the next start runs with (up() sets them)
    integrations: dict = INTEGRATIONS
    pods_ready_timeout: str = PODS_READY_TIMEOUT
    multikueue: bool = False

    def configuration(self, webhook_host: str, webhook_port: int, health_port: int) -> dict:
        return configuration(
            self.cert_dir,
            webhook_host,
            webhook_port,
            health_port,
            self.integrations,
            self.pods_ready_timeout,
            self.multikueue,
        )

    def probe(self) -> dict:
        return {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "localkube-probe"},
        }

    def state_fields(self, health_port: int) -> dict:
        return {
            "healthPort": health_port,
            "config": str(self.config),
            "integrations": self.integrations,
            "podsReadyTimeout": self.pods_ready_timeout,
            "multikueue": self.multikueue,
        }

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
        self.dir.mkdir(parents=True, exist_ok=True)
        if not installed:
            self.install(manifests, log, f"Kueue {built_version('kueue-manifests')}")
        self.integrations, self.pods_ready_timeout = integrations, pods_ready_timeout
        self.multikueue = multikueue
        self.start(kueue_bin, log, timeout)
        log(f"kueue up in {time.monotonic() - t0:.1f}s (log {self.log_path})")
        return self._state()

    def uninstall(self, timeout: float = 120) -> None:
        """Stop Kueue and delete its CRDs, with every object of its kinds (the finalizers Kueue
        would have removed, such as a Workload's resource-in-use, taken off by hand)."""
        self.down(log=lambda *_: None)
        self.delete_crds(kueue_crds(), timeout)
