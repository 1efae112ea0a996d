"""The real Kubeflow Trainer v2 controller on a local control plane (``make trainer-up``; the e2e
``real_trainer`` fixture), installed and run as JobSet's and Kueue's are (:mod:`localkube.controller`).

hack/build-kftrainer.sh builds ``github.com/kubeflow/trainer/v2``'s ``cmd/trainer-controller-manager``
from its module and renders the module's own ``manifests/overlays/manager`` (CRDs, RBAC, webhooks)
and ``manifests/overlays/runtimes`` (the default ClusterTrainingRuntimes: torch-distributed, ...);
here that rendering is applied server-side without its Deployment, and the manager runs as a host
process: leader election and metrics off, its status server off (the TrainJobStatus feature gate's
default), ports picked free, its cert rotator's Secret copied into its certificate directory, its
webhook Service reached through a hand-made EndpointSlice (the Service has three ports: the
slice's port is named ``webhook-server`` as the webhook's is, or the API server finds no endpoint).

Its certificate directory is fixed (``/tmp/k8s-webhook-server/serving-certs``, a constant of
``pkg/util/cert``; the webhook server reads it too): where JobSet's rotator also looks and where
the clusters of every session on this host would meet. The manager runs in a mount namespace of
its own (``unshare --mount``) in which this cluster's ``<state>/kftrainer/certs`` is bind-mounted
there: each cluster's Trainer reads its own certificate, and the host's directory is untouched.

JobSet must be up first (``make jobset-up``): Trainer renders each TrainJob into a JobSet and
watches JobSets. ``up`` is idempotent; ``down`` stops the manager and takes away its webhook
configurations (TrainJob and runtime creates would otherwise fail while it is down).
"""

from __future__ import annotations

import time

from .controller import HostController, built_version, manifests_path
from .controlplane import ClusterError, binary
from .jobset import JobSet

NAMESPACE = "kubeflow-system"
SECRET = "kubeflow-trainer-webhook-cert"
SERVICE = "kubeflow-trainer-controller-manager"
SLICE = "kubeflow-trainer-controller-manager-localkube"
MANAGER = "trainer-controller-manager"
# pkg/util/cert's certDir: the rotator waits for tls.crt there, the webhook server serves it
FIXED_CERT_DIR = "/tmp/k8s-webhook-server/serving-certs"
WEBHOOK_CONFIGS = (
    "mutatingwebhookconfiguration/defaulter.trainer.kubeflow.org",
    "validatingwebhookconfiguration/validator.trainer.kubeflow.org",
)
RUNTIMES = ("ClusterTrainingRuntime", "TrainingRuntime")
CRDS = (
    "trainjobs.trainer.kubeflow.org",
    "trainingruntimes.trainer.kubeflow.org",
    "clustertrainingruntimes.trainer.kubeflow.org",
)


def configuration(webhook_host: str, webhook_port: int, health_port: int) -> dict:
    """Trainer's Configuration (config.trainer.kubeflow.org/v1alpha1) for the host process."""
    return {
        "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
        "kind": "Configuration",
        "health": {
            "healthProbeBindAddress": f"127.0.0.1:{health_port}",
            "readinessEndpointName": "readyz",
            "livenessEndpointName": "healthz",
        },
        "metrics": {"bindAddress": "0"},  # off: nothing scrapes it here
        "webhook": {"host": webhook_host, "port": webhook_port},
        "leaderElection": {"leaderElect": False},
        "certManagement": {"enable": True, "webhookServiceName": SERVICE, "webhookSecretName": SECRET},
        "clientConnection": {"qps": 50, "burst": 100},
    }


class KFTrainer(HostController):
    """The real Kubeflow Trainer controller of one local cluster (``ControlPlane``)."""

    name, title = "kftrainer", "Kubeflow Trainer"
    namespace, secret, service, slice_name = NAMESPACE, SECRET, SERVICE, SLICE
    webhook_configs = WEBHOOK_CONFIGS
    slice_port_name = "webhook-server"

    def configuration(self, webhook_host: str, webhook_port: int, health_port: int) -> dict:
        return configuration(webhook_host, webhook_port, health_port)

    def command(self, manager: str) -> list[str]:
        # this cluster's certificate directory over the fixed one, in a mount namespace of its own
        # (unshare without --fork and sh's exec: the recorded PID is the manager's)
        script = 'mkdir -p "$1" && mount --bind "$0" "$1" && shift && exec "$@"'
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            str(self.cert_dir),
            FIXED_CERT_DIR,
            *super().command(manager),
        ]

    def probe(self) -> dict:
        """A ClusterTrainingRuntime: its server-side dry run passes Trainer's validating webhook."""
        return {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "ClusterTrainingRuntime",
            "metadata": {"name": "localkube-probe"},
            "spec": {
                "mlPolicy": {"numNodes": 1, "torch": {}},
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {
                                "name": "node",
                                "template": {
                                    "metadata": {
                                        "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
                                    },
                                    "spec": {
                                        "template": {"spec": {"containers": [{"name": "node", "image": "x"}]}}
                                    },
                                },
                            }
                        ]
                    }
                },
            },
        }

    def up(self, log=print, timeout: float = 180) -> dict:
        if not self.cp.running():
            raise ClusterError(f"the cluster of {self.cp.dir} is not running: `make cluster-up` first")
        manifests = manifests_path(
            "kftrainer", MANAGER, "Kubeflow Trainer", "build-kftrainer.sh", "trainer-up"
        )
        manager = binary(MANAGER)
        if self.running():
            log(f"kubeflow trainer {built_version(MANAGER)} already running (pid {self.pid()})")
            return self._state()
        if not JobSet(self.cp).running():
            raise ClusterError(
                "Kubeflow Trainer renders every TrainJob into a JobSet and watches JobSets, and JobSet "
                "does not run on this cluster: `make jobset-up` first"
            )
        self.down(log=lambda *_: None, keep_webhooks=True)
        t0 = time.monotonic()
        self.dir.mkdir(parents=True, exist_ok=True)
        # its own validating webhook admits the runtimes: applied once it answers
        runtimes = self.install(
            manifests,
            log,
            f"Kubeflow Trainer {built_version('kftrainer-manifests')}",
            later=frozenset(RUNTIMES),
        )
        self.start(manager, log, timeout)
        self._apply(runtimes)
        log(f"{len(runtimes)} ClusterTrainingRuntimes: {', '.join(o['metadata']['name'] for o in runtimes)}")
        log(f"kubeflow trainer up in {time.monotonic() - t0:.1f}s (log {self.log_path})")
        return self._state()

    def uninstall(self, timeout: float = 120) -> None:
        """Stop Trainer and delete its CRDs with every TrainJob and runtime (their JobSets go with
        them; the runtimes' resource-in-use finalizers taken off by hand)."""
        self.down(log=lambda *_: None)
        self.delete_crds(list(CRDS), timeout)
