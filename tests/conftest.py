"""The test tiers: the first folder under tests/ is the tier, and each is a marker of that name.

``tests/unit``
    In-process tests, and commands that answer at once (``helm template``, ``kubectl kustomize``,
    a CLI's output or refusal): no Kubernetes build (kubectl and helm only: ``make clients``), no
    images, no forked torch ranks. ``make unit``, the edit-test loop.
``tests/integration``
    Whole programs at work (torchrun, pip, buildah, a benchmark's small mode), forked torch ranks,
    network namespaces: no control plane. ``make integration``.
``tests/e2e``
    Against the local control plane (its fixtures, ``cluster``, ``member_clusters`` and
    ``namespace``, are tests/e2e/conftest.py's). ``make e2e``.

``make test`` runs all three. ``-m unit|integration|e2e`` selects a tier wherever the paths given
reach (tests/unit/repo/test_import_directions.py keeps every test file in a tier folder, and the
helpers they share in tests/helpers). A test outside tests/e2e that starts a control plane fails.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
TIERS = {
    "unit": "in-process: no Kubernetes build, no images, no forked torch ranks (make unit)",
    "integration": "runs whole programs, forked torch ranks or network namespaces (make integration)",
    "e2e": "needs the local Kubernetes control plane (make e2e)",
}


def pytest_configure(config):
    for tier, what in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: {what}")
    config.addinivalue_line(
        "markers",
        "cpu_torch: a dry-run test whose numbers are checked with torch's CPU wheel only; skipped, "
        "saying so, where the torch installed is a CUDA build (the dry run itself runs on either: "
        "trainer/holmes/trainer/dryrun/fakecuda.py, and tests/integration/trainer/test_dryrun.py "
        "runs everywhere; on the CUDA build test_dryrun_replicas' outer-state peak reads equal to "
        "the peak without it, 0.588 GiB both, not yet explained)",
    )
    config.addinivalue_line(
        "markers",
        "compat: the compatibility tier: also run by `make compat` on the oldest release the chart "
        "supports (its kubeVersion; HOLMES_K8S_VERSION, docs/install.md), besides `make test` on "
        "the default release",
    )
    config.addinivalue_line(
        "markers",
        "real_nodes: runs on nodes of the real kubelet on containerd (hack/localkube/realnode.py); "
        "`make e2e-real-nodes` builds what they need (`make node`) and runs them. Left out of "
        "`make test` (skipped, saying so) while their cold build (about 10 min on 2 cores after "
        "`make k8s`: containerd, Multus, CoreDNS, the DRA plugin) does not fit its budget",
    )
    config.addinivalue_line(
        "markers",
        "node_agent: proves the node agent itself (hack/localkube: its host processes, container "
        "runner, pod network, log files, power switch); skipped, saying so, where the session "
        "cluster's nodes are real kubelets (HOLMES_E2E_TOPOLOGY), which have none of it",
    )


def torch_is_a_cuda_build() -> bool:
    """Whether the installed torch carries CUDA libraries (found without importing torch)."""
    spec = importlib.util.find_spec("torch")
    roots = list(spec.submodule_search_locations or []) if spec else []
    return any(next(Path(r, "lib").glob("libtorch_cuda*"), None) for r in roots)


def tier_of(path: Path) -> str | None:
    """The tier of a test file: the first folder under tests/, or None outside a tier folder."""
    parts = Path(path).resolve().relative_to(TESTS).parts
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


def pytest_collection_modifyitems(config, items):
    cuda_build = None
    real_nodes = os.environ.get("HOLMES_REAL_NODES") == "1"  # make e2e-real-nodes
    for item in items:
        tier = tier_of(item.path)
        if tier is not None:
            item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("real_nodes") and not real_nodes:
            item.add_marker(pytest.mark.skip(reason="on real kubelet nodes: run by `make e2e-real-nodes`"))
        if item.get_closest_marker("cpu_torch"):
            cuda_build = torch_is_a_cuda_build() if cuda_build is None else cuda_build
            if cuda_build:
                item.add_marker(
                    pytest.mark.skip(
                        reason="its numbers are checked with torch's CPU wheel only and this torch is "
                        "a CUDA build: put the CPU wheel of torch==2.13.0 in pip's find-links and run "
                        "make venv"
                    )
                )


@pytest.fixture(autouse=True)
def _control_planes_only_in_e2e(request, monkeypatch):
    """A test outside tests/e2e that started a control plane of its own would make `make unit` or
    `make integration` need the Kubernetes build. It fails instead, naming the fix."""
    if tier_of(request.node.path) == "e2e":
        return
    from localkube.controlplane import ControlPlane

    def refuse(*args, **kwargs):
        raise RuntimeError(
            f"{request.node.nodeid} starts a control plane outside tests/e2e: move it there and use "
            "the cluster or member_clusters fixture"
        )

    monkeypatch.setattr(ControlPlane, "up", refuse)
