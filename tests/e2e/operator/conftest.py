"""Fixtures the operator's cluster tests share (the cluster itself: tests/e2e/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def crd(cluster):
    """The local cluster with the HolmesJob CRD installed."""
    from localkube.operatorproc import install_crd

    install_crd(cluster.kubeconfig)
    return cluster


@pytest.fixture
def host_path_operator(crd, namespace, tmp_path):
    """An operator for the tests whose trainers share a host directory (``shared_dir``): restarts
    after 1 s, progress read every second (hostPath volumes: the test namespace enforces no Pod
    Security level)."""
    from tests.helpers.operator.cluster_helpers import running_operator

    extra = ["--restart-backoff-seconds=1", "--progress-interval=1"]
    yield from running_operator(crd, namespace, tmp_path, extra=extra, tail=60)


@pytest.fixture
def shared_dir(tmp_path):
    """A host directory every trainer pod can write (they run as other users)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    return shared
