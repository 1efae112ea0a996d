"""Running a bench script the way its tests do: this Python, from the repository root, its
output captured."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO

BENCH = REPO / "bench"


def run_bench(
    script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``python bench/<script>.py args`` with ``env`` added to this process's environment."""
    return subprocess.run(
        [sys.executable, str(BENCH / f"{script}.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **(env or {})},
    )
