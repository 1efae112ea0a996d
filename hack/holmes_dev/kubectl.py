"""kubectl against one cluster's kubeconfig, its output captured: the one runner under the
tests', the benchmarks' and the demos' kubectl wrappers, which each decide what a failure means
(a test's AssertionError, a bench's RuntimeError, a demo's exit)."""

from __future__ import annotations

import subprocess
import time


def run_kubectl(
    kubectl: str, kubeconfig: str, *args: str, input: str | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """``kubectl --kubeconfig=KUBECONFIG args`` (text in and out), whatever its exit code."""
    cmd = [kubectl, f"--kubeconfig={kubeconfig}", *args]
    return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)


def wait_established(kubectl: str, kubeconfig: str, crd: str, timeout: float = 60) -> str | None:
    """Wait until the API server has written the CRD's ``Established`` condition: None once it
    has, else what was last seen. Not ``kubectl wait``: that fails at once ("status.conditions
    accessor error") on a CRD just created, whose status is not written yet."""
    end = time.monotonic() + timeout
    while True:
        r = run_kubectl(
            kubectl, kubeconfig, "get", f"crd/{crd}", "-o",
            'jsonpath={.status.conditions[?(@.type=="Established")].status}',
        )  # fmt: skip
        if r.returncode == 0 and r.stdout.strip() == "True":
            return None
        if time.monotonic() > end:
            seen = r.stderr.strip() or r.stdout.strip() or "no condition yet"
            return f"crd/{crd} not Established after {timeout:.0f}s: {seen}"
        time.sleep(0.2)


def require_established(kubectl: str, kubeconfig: str, *crds: str, timeout: float = 60) -> None:
    """wait_established for each CRD; RuntimeError saying what was last seen if one is not."""
    for crd in crds:
        problem = wait_established(kubectl, kubeconfig, crd, timeout)
        if problem is not None:
            raise RuntimeError(problem)
