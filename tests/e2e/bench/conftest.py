"""The bench tests' fixture.

``hollow_bench_cluster`` (session scope)
    A private local control plane whose topology is the hollow nodes (``playedBy: kwok``) the
    small modes of bench/operator_load.py (``--jobs=2``: 4 nodes, one pair per job) and
    bench/operator_apply.py (``--sizes 8``) run on, as ``bench/operator_load.py --jobs=2
    --apply-nodes=8 --write-topology FILE`` writes them (8 nodes, the first 4 with a pair's
    label): one cluster start for both benches, each given it as ``$HOLMES_KUBECONFIG``. Not the
    session's ``cluster``, whose nodes are the default topology's. Yields its kubeconfig (str);
    stopped after the last test asking for it.
"""

from __future__ import annotations

import os
import shutil
import sys

import pytest

from tests.conftest import REPO
from tests.helpers.bench.bench_run import run_bench
from tests.helpers.cluster.early_stop import stop_after_last_user


@pytest.fixture(scope="session")
def hollow_bench_cluster(tmp_path_factory):
    from localkube.controlplane import ControlPlane

    topology = tmp_path_factory.mktemp("hollow-bench") / "topology.yaml"
    p = run_bench("operator_load", "--jobs=2", "--apply-nodes=8", f"--write-topology={topology}")
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    cp = ControlPlane(REPO / ".holmes" / f"pytest-hollow-{os.getpid()}")
    cp.dir.mkdir(parents=True, exist_ok=True)

    def stop():
        cp.down(log=lambda m: None)
        shutil.rmtree(cp.dir, ignore_errors=True)

    stop = stop_after_last_user("hollow_bench_cluster", stop)
    try:
        cp.up(topology, log=lambda m: print(f"[localkube] {m}", file=sys.stderr))
        yield str(cp.kubeconfig)
    finally:
        stop()
