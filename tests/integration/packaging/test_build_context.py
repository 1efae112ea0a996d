"""The cache key of `make images` covers exactly what the build sees: buildah, reading the
project's .dockerignore, sends the files holmes_dev.images.context_files lists (and so never
.venv, .holmes, tests or caches)."""

from __future__ import annotations

import subprocess

from holmes_dev import images

from tests.helpers.packaging.packaging_helpers import REPO

LIST_CONTEXT = f"FROM {images.BASE_REF}\nCOPY . /ctx\nRUN cd /ctx && find . -type f | sort\n"


def test_buildah_sends_the_files_the_cache_key_covers(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(LIST_CONTEXT)
    iidfile = tmp_path / "iid"
    proc = subprocess.run(
        ["buildah", "build", "--runtime", "runc", "--network", "none", "--iidfile", str(iidfile)]
        + ["-f", str(dockerfile), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if iidfile.exists():
        subprocess.run(["podman", "rmi", iidfile.read_text().strip()], capture_output=True)
    assert proc.returncode == 0, f"buildah build failed (make images builds the base):\n{proc.stderr[-3000:]}"
    sent = sorted(line[2:] for line in proc.stdout.splitlines() if line.startswith("./"))
    assert sent == images.context_files(REPO)
    assert "operator/holmes/operator/__main__.py" in sent
