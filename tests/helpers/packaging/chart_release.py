"""A Helm release of the chart in the local test cluster, for the cluster tests of the chart
(test_chart_cluster, test_chart_images): kubectl/helm bound to the cluster, the release's names and
values, and the small HolmesJob they train."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import yaml
from holmes_dev import images
from holmes_dev.jobs import holmes_job
from holmes_dev.ports import free_port

from tests.helpers.packaging.packaging_helpers import CHART, CRDS, cache_bin, helm, run
from tests.helpers.polling import wait_for

CRD_NAME = "holmesjobs.holmes.dev"


def built_repositories() -> tuple[str, str]:
    """The repositories of the operator and trainer images ``make images`` built (the chart's
    ``image.repository`` and ``trainer.image.repository``; their tag is the chart's appVersion)."""
    operator, trainer = (images.image_ref(t).rsplit(":", 1)[0] for t in ("operator", "trainer"))
    return operator, trainer


class Env:
    """kubectl/helm bound to the test cluster's kubeconfig, and the module's names. With
    ``built_images`` the release runs the images ``make images`` built (localhost/holmes-*), not
    the chart's default names, which only the node agent runs (as host processes): a real node
    would try to pull them."""

    def __init__(self, kubeconfig: Path, built_images: bool = False):
        self.kubeconfig = str(kubeconfig)
        self.built_images = built_images
        suffix = uuid.uuid4().hex[:6]
        self.release = f"hpkg-{suffix}"
        self.release_ns = f"hpkg-sys-{suffix}"
        self.job_ns = f"hpkg-jobs-{suffix}"
        self.fullname = f"{self.release}-holmes"
        self.liveness_port = free_port("0.0.0.0")
        self.metrics_port = free_port("0.0.0.0")
        # trainer ports of this module's jobs: other test sessions on the machine may train at once
        self.master_port = free_port("0.0.0.0")
        self.trainer_metrics_port = free_port("0.0.0.0")

    def kubectl(self, *args: str, check: bool = True, input: str | None = None):
        return run(
            [str(cache_bin() / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args], check=check, input=input
        )

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def helm(self, *args: str, check: bool = True, timeout: float = 300):
        return helm(*args, "--kubeconfig", self.kubeconfig, check=check, timeout=timeout)

    def install(self):
        """``helm install --wait`` of the chart with this module's values."""
        return self.helm(
            "install",
            self.release,
            str(CHART),
            "-n",
            self.release_ns,
            *self.values(),
            "--wait",
            "--timeout",
            "3m",
            timeout=240,
        )

    def values(self) -> list[str]:
        built = []
        if self.built_images:
            operator, trainer = built_repositories()
            built = ["--set", f"image.repository={operator}", "--set", f"trainer.image.repository={trainer}"]
        return [
            *built,
            "--set",
            "watch.allNamespaces=false",
            "--set",
            f"watch.namespaces={{{self.job_ns}}}",
            "--set",
            f"liveness.port={self.liveness_port}",
            "--set",
            f"metrics.port={self.metrics_port}",
            "--set",
            "liveness.initialDelaySeconds=1",
            "--set",
            f"trainer.masterPort={self.master_port}",
            "--set",
            f"trainer.metricsPort={self.trainer_metrics_port}",
            # the default topology advertises some RDMA nodes through NFD labels only
            "--set",
            "nics.clusterRdmaKinds.east=infiniband",
            "--set",
            "nics.clusterRdmaKinds.west=roce",
            # The node agent runs pods in the host's network namespace: a second replica could
            # not bind the same ports. Leader election stays on (one replica leads).
            "--set",
            "replicas=1",
        ]

    def provisioned(self) -> Iterator[Env]:
        """For a module fixture to ``yield from``: this release's namespaces created, a CRD applied
        by hand before (other tests apply crds/) adopted the way Helm documents (its ownership
        metadata names this release); at the end the release uninstalled, the namespaces deleted
        and the CRD left as crds/ defines it for whoever comes next."""
        for ns in (self.release_ns, self.job_ns):
            self.kubectl("create", "namespace", ns)
        if self.kubectl("get", "crd", CRD_NAME, check=False).returncode == 0:
            self.kubectl("label", "--overwrite", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm")
            self.kubectl(
                "annotate",
                "--overwrite",
                "crd",
                CRD_NAME,
                f"meta.helm.sh/release-name={self.release}",
                f"meta.helm.sh/release-namespace={self.release_ns}",
            )
        yield self
        self.helm("uninstall", self.release, "-n", self.release_ns, "--wait", check=False)
        self.kubectl("delete", "namespace", self.release_ns, self.job_ns, "--wait=false", check=False)
        self.kubectl("apply", "--validate=false", "-f", str(CRDS / "holmesjob.yaml"), check=False)

    def wait_for(self, what: str, fn, timeout: float = 180, every: float = 1.0):
        return wait_for(what, fn, timeout, every)


def tiny_job(name: str, **overrides) -> dict:
    spec = {
        "model": {"layers": 2, "hiddenSize": 32, "attentionHeads": 2, "seqLength": 16, "vocabSize": 64},
        "training": {
            "globalBatchSize": 4,
            "microBatchSize": 1,
            "iterations": 3,
            "learningRate": 1e-3,
            "seed": 1,
            "data": {"synthetic": {}},
        },
        "parallelism": {
            "tensor": 1,
            "pipeline": 2,
            "data": 1,
            "partition": "uniform",
            "nicSelection": "auto",
        },
        "nodes": {"count": 2, "gpusPerNode": 1},
        "runPolicy": {"backoffLimit": 0},
    }
    for path, value in overrides.items():
        node = spec
        keys = path.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return holmes_job(name, spec)


def apply_job(env: Env, job: dict) -> None:
    env.kubectl("apply", "-n", env.job_ns, "-f", "-", input=yaml.safe_dump(job))


def job_obj(env: Env, name: str) -> dict:
    return env.get("holmesjob", name, "-n", env.job_ns)


def operator_pod(env: Env) -> dict | None:
    pods = env.get("pods", "-n", env.release_ns, "-l", f"app.kubernetes.io/instance={env.release}")["items"]
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return live[0] if len(live) == 1 else None
