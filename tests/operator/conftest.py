"""Fixtures the operator's cluster tests share (the cluster itself: tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def crd(cluster):
    """The local cluster with the HolmesJob CRD installed."""
    from localkube.operatorproc import install_crd

    install_crd(cluster)
    return cluster
