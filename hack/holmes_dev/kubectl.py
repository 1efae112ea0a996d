"""kubectl against one cluster's kubeconfig, its output captured: the one runner under the
tests', the benchmarks' and the demos' kubectl wrappers, which each decide what a failure means
(a test's AssertionError, a bench's RuntimeError, a demo's exit)."""

from __future__ import annotations

import subprocess


def run_kubectl(
    kubectl: str, kubeconfig: str, *args: str, input: str | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """``kubectl --kubeconfig=KUBECONFIG args`` (text in and out), whatever its exit code."""
    cmd = [kubectl, f"--kubeconfig={kubeconfig}", *args]
    return subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
