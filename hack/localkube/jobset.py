"""The real JobSet controller on a local control plane (``make jobset-up``; the e2e ``real_jobset``
fixture), installed and run as :mod:`localkube.kueue` runs Kueue.

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

import base64
import json
import time
from pathlib import Path

import yaml
from holmes_dev.kubectl import run_kubectl

from .controlplane import CACHE_BIN, ClusterError, ControlPlane, binary, mentions, pid_alive, stop_pid
from .kueue import MANAGED_BY, built_version, host_address, install_objects, pick_port

CACHE = CACHE_BIN.parent
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


def manifests_path() -> Path:
    version = built_version("jobset-manifests")
    path = CACHE / "jobset" / str(version) / "manifests.yaml"
    if not version or not path.exists() or not built_version("jobset"):
        raise ClusterError(
            f"JobSet is not built in {CACHE}: run `bash hack/build-jobset.sh` "
            "(or `make jobset-up`, which runs it)"
        )
    return path


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


class JobSet:
    """The real JobSet controller of one local cluster (``ControlPlane``)."""

    def __init__(self, cp: ControlPlane):
        self.cp = cp
        self.dir = cp.dir / "jobset"
        self.cert_dir = self.dir / "certs"
        self.config = self.dir / "config.yaml"
        self.log_path = cp.dir / "logs" / "jobset.log"

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120):
        r = run_kubectl(binary("kubectl"), str(self.cp.kubeconfig), *args, input=input, timeout=timeout)
        if check and r.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args[:3])} ... failed: {r.stderr.strip()[-1500:]}")
        return r

    def pid(self) -> int | None:
        pid = self.cp.state().get("pids", {}).get("jobset")
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
        """A server-side dry run of a JobSet passes JobSet's mutating and validating webhooks."""
        probe = {
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
        r = self.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(probe), check=False)
        return r.returncode == 0

    def _tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def up(self, log=print, timeout: float = 180) -> dict:
        if not self.cp.running():
            raise ClusterError(f"the cluster of {self.cp.dir} is not running: `make cluster-up` first")
        jobset_bin, manifests = binary("jobset"), manifests_path()
        if self.running():
            log(f"jobset {built_version('jobset')} already running (pid {self.pid()})")
            return self.cp.state()["jobset"]
        self.down(log=lambda *_: None, keep_webhooks=True)
        t0 = time.monotonic()
        crds, rest = install_objects(manifests.read_text())
        log(
            f"installing JobSet {built_version('jobset-manifests')}: "
            f"{len(crds)} CRD, {len(rest)} other objects"
        )
        self._apply(crds)
        # polled: `kubectl wait` fails outright on a CRD created so recently it has no status yet
        self._wait("JobSet's CRD to be established", self._crd_established, 60, started=False)
        self._apply(rest)
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        for f in self.cert_dir.iterdir():
            f.unlink()
        # another cluster's certificate there (a JobSet started earlier on this host) would let
        # the rotator through before this certDir has one: JobSet then exits, reading it
        for f in ROTATOR_CERT_DIR.glob("*"):
            f.unlink(missing_ok=True)
        host = host_address()
        for tries in range(3, 0, -1):
            try:
                self._start(jobset_bin, host, log, timeout)
                break
            except ClusterError as e:
                self.down(log=lambda *_: None, keep_webhooks=True)
                if "address already in use" not in str(e) or tries == 1:
                    self.down(log=lambda *_: None)
                    raise
                log("a port was taken before jobset bound it: starting it again on others")
            except BaseException:
                self.down(log=lambda *_: None)
                raise
        log(f"jobset up in {time.monotonic() - t0:.1f}s (log {self.log_path})")
        return self.cp.state()["jobset"]

    def _start(self, jobset_bin: str, host: str, log, timeout: float) -> None:
        webhook_port, health_port = pick_port(host), pick_port("127.0.0.1")
        self.config.write_text(
            yaml.safe_dump(configuration(self.cert_dir, host, webhook_port, health_port), sort_keys=False)
        )
        self._endpoint_slice(host, webhook_port)
        st = self.cp.state()
        st["jobset"] = {"version": built_version("jobset"), "webhook": f"{host}:{webhook_port}"}
        self.cp._save(st)
        log(f"starting jobset (webhook on {host}:{webhook_port}, health on 127.0.0.1:{health_port})")
        self.cp._spawn(
            st,
            "jobset",
            [
                jobset_bin,
                f"--config={self.config}",
                f"--kubeconfig={self.cp.kubeconfig}",
                "--zap-log-level=2",
            ],
        )
        self._wait_certificate(timeout)
        self._wait("the API server to reach JobSet's webhooks", self._webhook_answers, timeout)

    def _apply(self, objs: list[dict]) -> None:
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
        self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=localkube-jobset",
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

    def _crd_established(self) -> bool:
        r = self.kubectl("get", "crd", CRD, "-o", "json", check=False)
        conds = (
            (json.loads(r.stdout).get("status") or {}).get("conditions") or [] if r.returncode == 0 else []
        )
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    def _wait(self, what: str, ok, timeout: float, started: bool = True) -> None:
        """Poll ``ok`` for ``timeout`` seconds; ``started``: the manager runs (its exit ends the wait)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ok():
                return
            if started and self.pid() is None:
                raise ClusterError(f"jobset exited while starting; log tail:\n{self._tail()}")
            time.sleep(0.5)
        raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}; log tail:\n{self._tail()}")

    def _wait_certificate(self, timeout: float) -> None:
        """Copy the cert rotator's Secret into certDir and ROTATOR_CERT_DIR (what mounting it in
        a pod would do)."""

        def copied() -> bool:
            r = self.kubectl("get", "secret", SECRET, "-n", NAMESPACE, "-o", "json", check=False)
            data = (json.loads(r.stdout).get("data") or {}) if r.returncode == 0 else {}
            if not data.get("tls.crt") or not data.get("tls.key"):
                return False
            for d in (self.cert_dir, ROTATOR_CERT_DIR):
                d.mkdir(parents=True, exist_ok=True)
                for key, value in data.items():
                    path = d / key
                    path.write_bytes(base64.b64decode(value))
                    path.chmod(0o600)
            return True

        self._wait(f"JobSet's cert rotator to write Secret {NAMESPACE}/{SECRET}", copied, timeout)

    def down(self, log=print, grace: float = 10.0, keep_webhooks: bool = False) -> None:
        """Stop the manager; unless ``keep_webhooks``, remove its webhook configurations and endpoint."""
        pid = self.pid()
        if pid is not None:
            log(f"stopping jobset (pid {pid})")
            stop_pid(pid, grace)
        st = self.cp.state()
        if st.get("pids", {}).pop("jobset", None) is not None or "jobset" in st:
            st.pop("jobset", None)
            self.cp._save(st)
        if not keep_webhooks and self.cp.running():
            self.kubectl("delete", *WEBHOOK_CONFIGS, "--ignore-not-found", check=False)
            self.kubectl("delete", "endpointslice", SLICE, "-n", NAMESPACE, "--ignore-not-found", check=False)

    def uninstall(self, timeout: float = 120) -> None:
        """Stop JobSet and delete its CRD with every JobSet (their Jobs and pods go with them)."""
        self.down(log=lambda *_: None)
        self.kubectl("delete", "crd", CRD, "--ignore-not-found", f"--timeout={timeout:.0f}s", check=False)
