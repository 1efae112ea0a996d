"""The Kubernetes API schemas of every release the chart supports (Chart.yaml kubeVersion
>=1.34.0-0), for tests/unit/packaging/test_chart_k8s_schemas.py, with no API server of those
releases: the Go module k8s.io/kubernetes of each release carries its published OpenAPI v3
documents (api/openapi-spec/v3/*.json, one per group/version, every API the release has, alpha
and beta included). `make k8s-openapi` (this script) downloads each module with `go mod
download` into the cache's Go module cache (as hack/build-k8s.sh does: checksummed, kept, so a
rerun is offline; ~18 MB of zip per release, v1.37.2's shared with the control plane build) and
distills its documents into one file per release:

    ${HOLMES_CACHE:-~/.cache/holmes}/k8s-openapi/<version>.json
      groupVersions  {"apps/v1": "ga", "resource.k8s.io/v1beta2": "beta", ...}: what the
                     release has; only "ga" ones are served without a feature gate or
                     --runtime-config (every beta API added since 1.24 is off by default)
      kinds          {"apps/v1/Deployment": "io.k8s.api.apps.v1.Deployment", ...}
      schemas        the components' schemas (descriptions dropped), keyed by name

`load(version)` reads one back. A release's file is rewritten only when missing."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

# The newest patch of each supported minor release the module proxy serves (v1.37.2: the one the
# tests run, hack/build-k8s.sh). A new minor release: add it here and in docs/install.md.
VERSIONS = ("v1.34.4", "v1.35.4", "v1.36.3", "v1.37.2")
CACHE = Path(os.environ.get("HOLMES_CACHE", Path.home() / ".cache" / "holmes"))
OUT = CACHE / "k8s-openapi"
SPEC_DIR = "api/openapi-spec/v3/"
# apis__<group>__<version>_openapi.json, api__v1_openapi.json (the core group)
SPEC_FILE = re.compile(r"^(?:api__(v1)|apis__([^_]+)__([^_]+))_openapi\.json$")


def path(version: str) -> Path:
    return OUT / f"{version}.json"


def load(version: str) -> dict[str, Any]:
    p = path(version)
    if not p.is_file():
        raise FileNotFoundError(
            f"{p} is missing: run `make k8s-openapi` (hack/k8s_openapi.py downloads Kubernetes "
            f"{version}'s OpenAPI documents from its Go module, once)"
        )
    return json.loads(p.read_text())


def stability(version: str) -> str:
    return "alpha" if "alpha" in version else "beta" if "beta" in version else "ga"


def _strip(node: Any, fields: bool = False) -> Any:
    """A schema without its descriptions; ``fields``: ``node`` is a properties map, whose keys
    are field names (a field may be called "description")."""
    if isinstance(node, dict):
        return {
            k: _strip(v, k == "properties" and not fields)
            for k, v in node.items()
            if fields or k != "description"
        }
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def distill(specs: dict[str, bytes]) -> dict[str, Any]:
    """One release's OpenAPI v3 documents (file name -> content) as the file described above."""
    group_versions: dict[str, str] = {}
    kinds: dict[str, str] = {}
    schemas: dict[str, Any] = {}
    for name, raw in sorted(specs.items()):
        m = SPEC_FILE.match(name)
        if not m:  # the discovery documents (api_openapi.json, apis__apps_openapi.json, ...)
            continue
        gv = m[1] or f"{m[2]}/{m[3]}"
        group_versions[gv] = stability(gv.rsplit("/", 1)[-1])
        for sname, schema in json.loads(raw).get("components", {}).get("schemas", {}).items():
            schemas.setdefault(sname, _strip(schema))
            for gvk in schema.get("x-kubernetes-group-version-kind", ()):
                api = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
                if api == gv:  # each document names the kinds of other groups it refers to too
                    kinds[f"{api}/{gvk['kind']}"] = sname
    return {"groupVersions": group_versions, "kinds": kinds, "schemas": schemas}


def module_zip(go: str, version: str, gomodcache: Path) -> Path:
    env = {**os.environ, "GOMODCACHE": str(gomodcache), "GOFLAGS": "-mod=mod", "GOTOOLCHAIN": "local"}
    with tempfile.TemporaryDirectory() as tmp:  # `go mod download` of a module needs a main module
        (Path(tmp) / "go.mod").write_text("module holmes.dev/k8s-openapi\n")
        out = subprocess.run(
            [go, "mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
        )
    info = json.loads(out.stdout or "{}")
    if out.returncode or info.get("Error") or not info.get("Zip"):
        sys.exit(f"go mod download k8s.io/kubernetes@{version} failed: {info.get('Error') or out.stderr}")
    return Path(info["Zip"])


def main() -> None:
    missing = [v for v in VERSIONS if not path(v).is_file()]
    if not missing:
        return
    go = shutil.which("go")
    if not go:
        sys.exit(
            "Go is not on PATH: hack/k8s_openapi.py downloads k8s.io/kubernetes' modules "
            "with `go mod download`"
        )
    OUT.mkdir(parents=True, exist_ok=True)
    for version in missing:
        print(
            f">> [k8s-openapi] Kubernetes {version}: OpenAPI v3 documents from its Go module", file=sys.stderr
        )
        prefix = f"k8s.io/kubernetes@{version}/{SPEC_DIR}"
        with zipfile.ZipFile(module_zip(go, version, CACHE / "go" / "mod")) as z:
            specs = {n[len(prefix) :]: z.read(n) for n in z.namelist() if n.startswith(prefix)}
        if not specs:
            sys.exit(f"k8s.io/kubernetes@{version} has no {SPEC_DIR}: cannot check the chart against it")
        tmp = path(version).with_suffix(f".tmp.{os.getpid()}")
        tmp.write_text(json.dumps(distill(specs), separators=(",", ":"), sort_keys=True))
        tmp.replace(path(version))


if __name__ == "__main__":
    main()
