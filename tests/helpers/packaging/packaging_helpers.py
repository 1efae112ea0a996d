"""Shared helpers for the packaging tests: where things are, running helm, rendering the chart."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

import yaml
from holmes_dev import images

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "holmes"
DEPLOY = REPO / "deploy"
CRDS = REPO / "crds"
CHART_CRDS = CHART / "files" / "crds"
GITOPS = REPO / "examples" / "gitops"
# libyaml's parser where PyYAML was built with it: the same objects as yaml.SafeLoader's
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def cache_bin() -> Path:
    return Path(os.environ.get("HOLMES_CACHE", Path.home() / ".cache" / "holmes")) / "bin"


def helm_path() -> str:
    """helm v3 built by hack/build-k8s.sh (or $HELM, or one on PATH)."""
    for cand in (os.environ.get("HELM"), str(cache_bin() / "helm"), shutil.which("helm")):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise RuntimeError("helm not found: run hack/build-k8s.sh (make test does) or set HELM=/path/to/helm")


def run(
    cmd: list[str],
    *,
    check: bool = True,
    timeout: float = 300,
    env: dict | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, input=input, env={**os.environ, **(env or {})}
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {proc.returncode}\n"
            f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
        )
    return proc


def helm(*args: str, check: bool = True, timeout: float = 300, env: dict | None = None):
    return run([helm_path(), *args], check=check, timeout=timeout, env=env)


def set_args(values: dict[str, str] | None) -> list[str]:
    out: list[str] = []
    for key, val in (values or {}).items():
        out += ["--set", f"{key}={val}"]
    return out


def render(
    values: dict[str, str] | None = None,
    *,
    namespace: str = "holmes-system",
    release: str = "holmes",
    extra: list[str] = (),
) -> list[dict]:
    """`helm template` of the chart, parsed into a list of objects (new ones on every call: a
    test may change what it gets)."""
    args = (release, str(CHART), "--namespace", namespace, *set_args(values), *extra)
    # a values file's content is not in the arguments: rendered afresh
    out = helm("template", *args).stdout if {"-f", "--values"} & set(extra) else _template(args)
    # (libyaml parses the chart's CRDs in a sixth of pure Python's time)
    return [d for d in yaml.load_all(out, Loader=SAFE_LOADER) if d]


@functools.cache
def _template(args: tuple[str, ...]) -> str:
    """`helm template` output, once per session for each set of arguments (the unit tier
    renders the chart with its defaults some twenty times; the render is deterministic)."""
    return helm("template", *args).stdout


def without_rules(node):
    """A CRD (or part of one) without its CEL rules, as a server older than 1.25 keeps it."""
    if isinstance(node, dict):
        return {k: without_rules(v) for k, v in node.items() if k != "x-kubernetes-validations"}
    if isinstance(node, list):
        return [without_rules(v) for v in node]
    return node


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict], kind: str) -> dict:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def dockerignore_excludes(rel: str) -> bool:
    """Whether .dockerignore keeps `rel` out of the build context (the matcher
    hack/build-images.sh keys its cache on, holmes_dev.images)."""
    return images.excluded(rel, images.dockerignore_rules((REPO / ".dockerignore").read_text()))
