"""The real JobSet controller on a local control plane (``make jobset-up``; the e2e ``real_jobset``
fixture), installed and run as :mod:`localkube.kueue` runs Kueue (:mod:`localkube.controller`).

hack/build-jobset.sh builds ``sigs.k8s.io/jobset``'s manager from its module and renders the
module's own ``config/default``; here that rendering is applied server-side without its
Deployment and the manager runs as a host process of the cluster's state dir: leader election
and metrics off, ports picked free, its cert rotator's Secret copied into its ``certDir``, its
webhook Service reached by the API server through a hand-made EndpointSlice (no kube-proxy).

Install it before Kueue: Kueue sets up its ``jobset.x-k8s.io/jobset`` integration at start when
JobSet's CRD is served; one started earlier polls for the CRD with a backoff of up to 2 minutes
(``jobframework.waitForAPI``) before it manages JobSets.

``up`` is idempotent; ``down`` stops the manager and takes away its webhook configurations (its
pod webhooks refuse every JobSet pod while nothing answers them).
"""

from __future__ import annotations

import time
from pathlib import Path

from .controller import HostController, built_version, manifests_path
from .controlplane import ClusterError, binary

NAMESPACE = "jobset-system"
SECRET = "jobset-webhook-server-cert"
SERVICE = "jobset-webhook-service"
SLICE = "jobset-webhook-service-localkube"
CRD = "jobsets.jobset.x-k8s.io"
# JobSet v0.12's cert rotator waits for tls.crt in this fixed directory (pkg/util/cert: a
# constant, not the configured webhook.certDir, where its webhook server reads the certificate):
# it only checks that the file exists, so the clusters of one host may share it, emptied before
# each start (then filled after certDir).
ROTATOR_CERT_DIR = Path("/tmp/k8s-webhook-server/serving-certs")
WEBHOOK_CONFIGS = (
    "mutatingwebhookconfiguration/jobset-mutating-webhook-configuration",
    "validatingwebhookconfiguration/jobset-validating-webhook-configuration",
)


def configuration(cert_dir: Path, webhook_host: str, webhook_port: int, health_port: int) -> dict:
    """JobSet's Configuration (config.jobset.x-k8s.io/v1alpha1) for the host process."""
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
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
    }


class JobSet(HostController):
    """The real JobSet controller of one local cluster (``ControlPlane``)."""

    name, title = "jobset", "JobSet"
    namespace, secret, service, slice_name = NAMESPACE, SECRET, SERVICE, SLICE
    webhook_configs = WEBHOOK_CONFIGS
    # another cluster's certificate there (a JobSet started earlier on this host) would let the
    # rotator through before this certDir has one: JobSet then exits, reading it; emptied by start()
    extra_cert_dirs = (ROTATOR_CERT_DIR,)

    def configuration(self, webhook_host: str, webhook_port: int, health_port: int) -> dict:
        return configuration(self.cert_dir, webhook_host, webhook_port, health_port)

    def probe(self) -> dict:
        """A JobSet: its server-side dry run passes JobSet's mutating and validating webhooks."""
        return {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": "localkube-probe", "namespace": "default"},
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "p",
                        "template": {
                            "spec": {
                                "template": {
                                    "spec": {
                                        "restartPolicy": "Never",
                                        "containers": [{"name": "c", "image": "x"}],
                                    }
                                }
                            }
                        },
                    }
                ]
            },
        }

    def up(self, log=print, timeout: float = 180) -> dict:
        if not self.cp.running():
            raise ClusterError(f"the cluster of {self.cp.dir} is not running: `make cluster-up` first")
        jobset_bin = binary("jobset")
        manifests = manifests_path("jobset", "jobset", "JobSet", "build-jobset.sh")
        if self.running():
            log(f"jobset {built_version('jobset')} already running (pid {self.pid()})")
            return self._state()
        self.down(log=lambda *_: None, keep_webhooks=True)
        t0 = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.install(manifests, log, f"JobSet {built_version('jobset-manifests')}")
        self.start(jobset_bin, log, timeout)
        log(f"jobset up in {time.monotonic() - t0:.1f}s (log {self.log_path})")
        return self._state()

    def uninstall(self, timeout: float = 120) -> None:
        """Stop JobSet and delete its CRD with every JobSet (their Jobs and pods go with them)."""
        self.down(log=lambda *_: None)
        self.kubectl("delete", "crd", CRD, "--ignore-not-found", f"--timeout={timeout:.0f}s", check=False)
