"""The kubectl plugin for krew (hack/krew.py, `make krew`): the committed manifest is the one the
generator writes, pins the sha256 of the archive it builds (the same bytes on every run), carries
the release's version, and its launcher runs the operator distribution's plugin, which imports
no torch (the trainer's dependency), or says how to install that distribution."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile

import krew
import yaml

from holmes.contract.release import RELEASE
from tests.helpers.packaging.packaging_helpers import REPO, cache_bin


def test_the_committed_manifest_is_the_generated_one_pinning_the_archive():
    data = krew.archive_bytes()
    assert data == krew.archive_bytes(), "the archive must be reproducible"
    text = krew.MANIFEST.read_text()
    assert text == krew.manifest(hashlib.sha256(data).hexdigest(), krew.PLACEHOLDER_URL), (
        "deploy/krew/holmes.yaml is stale: run `make krew`"
    )
    doc = yaml.safe_load(text)
    assert (doc["apiVersion"], doc["kind"]) == ("krew.googlecontainertools.github.com/v1alpha2", "Plugin")
    assert doc["metadata"]["name"] == "holmes" and doc["spec"]["version"] == f"v{RELEASE}"
    platforms = doc["spec"]["platforms"]
    assert {
        (p["selector"]["matchLabels"]["os"], p["selector"]["matchLabels"]["arch"]) for p in platforms
    } == set(krew.PLATFORMS)
    for p in platforms:
        assert p["sha256"] == hashlib.sha256(data).hexdigest() and p["bin"] == "kubectl-holmes"
        assert p["uri"].endswith(f"/v{RELEASE}/kubectl-holmes-v{RELEASE}.tar.gz")
    assert f"holmes-train-operator=={RELEASE}" in doc["spec"]["caveats"]


def test_the_launcher_runs_the_plugin_without_torch(tmp_path):
    with tarfile.open(fileobj=__import__("io").BytesIO(krew.archive_bytes())) as tar:
        tar.extractall(tmp_path, filter="data")
    launcher = tmp_path / "kubectl-holmes"
    assert launcher.stat().st_mode & 0o111 and (tmp_path / "LICENSE").exists()
    # torch (and the trainer's packages) made unimportable: the plugin must not need them
    block = (
        "import sys, runpy; sys.modules['torch'] = None; sys.modules['holmes.trainer'] = None; "
        f"sys.argv = ['kubectl-holmes', '--help']; runpy.run_path({str(launcher)!r}, run_name='__main__')"
    )
    r = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert "--all-namespaces" in r.stdout and "--as USER" in r.stdout


def test_the_launcher_says_how_to_install_the_distribution_when_it_is_missing(tmp_path):
    launcher = tmp_path / "kubectl-holmes"
    launcher.write_text(krew.LAUNCHER)
    # -I -S: no site-packages, so no holmes-train-operator
    r = subprocess.run(
        [sys.executable, "-I", "-S", str(launcher)], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1
    assert f"pip install --user holmes-train-operator=={RELEASE}" in r.stderr and "no torch" in r.stderr


def test_the_plugins_modules_come_from_the_operator_and_contract_distributions_only():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import holmes.kubectl_holmes, holmes.view.job_text, holmes.view.picture\n"
        "print('\\n'.join(m.__file__ for n, m in sys.modules.items() if n.startswith('holmes.') "
        "and getattr(m, '__file__', None)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    files = r.stdout.split()
    assert files
    outside = [f for f in files if not f.startswith((str(REPO / "operator"), str(REPO / "contract")))]
    assert outside == [], outside


def test_krew_installs_the_manifest_and_the_real_kubectl_runs_the_plugin(tmp_path):
    """krew itself (sigs.k8s.io/krew, built by hack/build-k8s.sh clients) takes the committed
    manifest with the archive it pins (checking its sha256, downloading nothing), and kubectl
    finds the installed plugin on PATH and passes its flags through."""
    krew_bin, kubectl = cache_bin() / "krew", cache_bin() / "kubectl"
    assert krew_bin.exists() and kubectl.exists(), "krew or kubectl missing: run hack/build-k8s.sh clients"
    archive = tmp_path / krew.ARCHIVE
    archive.write_bytes(krew.archive_bytes())
    env = {**os.environ, "KREW_ROOT": str(tmp_path / "krew"), "HOME": str(tmp_path)}
    r = subprocess.run(
        [str(krew_bin), "install", f"--manifest={krew.MANIFEST}", f"--archive={archive}"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "krew" / "bin" / "kubectl-holmes").exists()
    # the launcher runs the first python on PATH: this test's, which has the operator distribution
    path = [str(tmp_path / "krew" / "bin"), os.path.dirname(sys.executable), env["PATH"]]
    env["PATH"] = os.pathsep.join(path)
    r = subprocess.run(
        [str(kubectl), "holmes", "-A", "--as", "someone", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "--all-namespaces" in r.stdout and "--as USER" in r.stdout
    r = subprocess.run([str(kubectl), "plugin", "list"], capture_output=True, text=True, timeout=60, env=env)
    assert str(tmp_path / "krew" / "bin" / "kubectl-holmes") in r.stdout, r.stdout + r.stderr
