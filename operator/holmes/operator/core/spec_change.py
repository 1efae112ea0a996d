"""Which fields of a launched job's spec changed in a way its plan or pods depend on. Pure.

A launch records, in the job's ConfigMap, the spec it was made from (``launch_record``). A spec
read later is compared with it after both went through this release's parser, so the parser's
defaults are applied to each side: a CRD upgrade whose new field defaults to the old behaviour
(the API server fills it into every stored job) changes nothing, while an edit names its field.
Not compared: ``runPolicy`` (takes effect at once) and, for a running job, ``template.metadata``
(labels and annotations a policy engine or a GitOps tool adds; they reach the pods of the next
attempt). A job with no pods (a restart's back-off) compares them too: any edit may be the fix.

``holmes.dev/spec-hash`` keeps the meaning it had before this comparison (a hash of the spec as
stored, runPolicy left out): equal, nothing changed, without parsing anything. A ConfigMap written
by a release before the record (no ``launch-spec.json``) is compared through its ``job.yaml``,
the spec that release parsed with its defaults, so upgrading the operator relaunches nothing."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import yaml

from holmes.contract import JobSpec, SpecError

from . import child_names
from .replicas import REPLICAS_FILE

# What ``across_plan.replica_job`` rewrites in the job.yaml of a replicas launch: a ConfigMap of
# an earlier release records the replica's share there, not the job's own value.
_REPLICA_SHARE = frozenset(
    {
        "training.globalBatchSize",
        "training.acrossIslands.mode",
        "nodes.count",
        "nodes.minCount",
        "parallelism.pipeline",
        "parallelism.data",
    }
)
MAX_NAMED = 5  # fields named in a message; more are counted


def launch_view(spec: JobSpec, metadata: bool = False) -> dict[str, Any]:
    """The spec as its plan and pods depend on it: parsed (defaults applied), without runPolicy
    and (unless ``metadata``) template.metadata."""
    view = spec.to_spec()
    view.pop("runPolicy", None)
    return view if metadata else _without_metadata(view)


def _without_metadata(view: Mapping) -> dict[str, Any]:
    out = dict(view)
    out["template"] = {k: v for k, v in (out.get("template") or {}).items() if k != "metadata"}
    return out


def launch_record(spec: JobSpec) -> str:
    """The ConfigMap's ``launch-spec.json``: ``launch_view`` with template.metadata, as canonical
    JSON."""
    return json.dumps(launch_view(spec, metadata=True), sort_keys=True, separators=(",", ":"))


def changes(configmap: Mapping | None, spec: Mapping, parsed: JobSpec, metadata: bool = False) -> list[str]:
    """The fields (paths under spec, e.g. ``training.iterations``) whose value differs between
    the launch ``configmap`` records and the job's ``spec`` as read now (``parsed``: that spec
    parsed); [] when the same or nothing is recorded (no ConfigMap: nothing launched).
    ``metadata``: compare template.metadata too."""
    meta = (configmap or {}).get("metadata") or {}
    launched = (meta.get("annotations") or {}).get(child_names.ANN_SPEC_HASH)
    if not launched or launched == child_names.spec_hash(spec):
        return []
    data = (configmap or {}).get("data") or {}
    now = launch_view(parsed, metadata)
    if child_names.LAUNCH_SPEC_FILE in data:
        try:
            recorded = json.loads(data[child_names.LAUNCH_SPEC_FILE])
        except (TypeError, ValueError):
            return ["(the launch record is unreadable)"]
        return diff(_normalized(recorded, metadata), now)
    return _legacy_changes(data, now, metadata)


def _legacy_changes(data: Mapping, now: dict, metadata: bool) -> list[str]:
    """A ConfigMap written before the launch record: its job.yaml (the spec that release parsed,
    a replica's share for replicas)."""
    try:
        manifest = yaml.safe_load(data.get(child_names.JOB_FILE) or "")
        recorded = dict(manifest["spec"])
    except (yaml.YAMLError, KeyError, TypeError, ValueError):
        return ["(the launched spec is not recorded)"]
    recorded.pop("runPolicy", None)
    fields = diff(_normalized(recorded, metadata), now)
    if REPLICAS_FILE in data:
        fields = [f for f in fields if f not in _REPLICA_SHARE]
    return fields


def _normalized(recorded: Mapping, metadata: bool) -> Any:
    """A recorded spec with this release's defaults applied (as recorded if it no longer parses:
    then its differences are named as they are)."""
    try:
        return launch_view(JobSpec.from_spec(dict(recorded)), metadata)
    except SpecError:
        return dict(recorded) if metadata else _without_metadata(recorded)


def diff(old: Any, new: Any, path: str = "") -> list[str]:
    """The paths where two JSON values differ: into mappings by key and lists of equal length by
    index, else the path itself."""
    if old == new:
        return []
    if isinstance(old, Mapping) and isinstance(new, Mapping):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in old or key not in new:
                out.append(sub)
            else:
                out += diff(old[key], new[key], sub)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [p for i, (a, b) in enumerate(zip(old, new)) for p in diff(a, b, f"{path}[{i}]")]
    return [path or "spec"]


def model_changed(fields: list[str]) -> bool:
    return any(f == "model" or f.startswith(("model.", "model[")) for f in fields)


def describe(fields: list[str]) -> str:
    """``spec.a, spec.b and 3 more field(s)`` for a message."""
    named = ", ".join(f"spec.{f}" if not f.startswith("(") else f for f in fields[:MAX_NAMED])
    more = len(fields) - MAX_NAMED
    return named + (f" and {more} more field(s)" if more > 0 else "")
