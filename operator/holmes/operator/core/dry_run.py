"""The API server's check of a job's rendered pods before the gang is created (pure parts).

Pod validation, unknown fields and Pod Security are the API server's: before creating a gang,
kube.py sends a server-side dry run (``dryRun=All``, ``fieldValidation=Strict``) of one pod of
each shape (``samples``: pods that differ only in their rank, node and ports are one shape), so a
misspelt field (``nodeSelectr``), an invalid value or a pod the namespace's Pod Security level
refuses stops the job with the API server's own message before any pod exists. ``about_template``
tells which refusals the template can fix; ``message`` names the job's field (``spec.template...``)
for the pod's (``spec...``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from . import child_names
from .state import ChildRefusal

# pod fields that differ between the pods of one gang without changing what the API server checks
_RANK_ENV = ("NODE_RANK", "PET_NODE_RANK", "MASTER_ADDR", "PET_MASTER_ADDR", "MASTER_PORT", "PET_MASTER_PORT")


def _shape(pod: dict) -> str:
    """The pod less what differs between the ranks of one shape (no copy: a gang may be large)."""
    meta = pod.get("metadata") or {}
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k not in ("hostname", "affinity")}
    spec["containers"] = [
        {
            **{k: v for k, v in c.items() if k not in ("command", "ports")},
            "env": [e for e in c.get("env") or [] if e.get("name") not in _RANK_ENV],
        }
        for c in spec.get("containers") or []
    ]
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != child_names.ANN_NODE}
    return json.dumps({"annotations": annotations, "spec": spec}, sort_keys=True, default=str)


def samples(pods: Iterable[dict]) -> list[dict]:
    """One pod of each shape, in order: what a dry run needs to see of the gang."""
    seen: set[str] = set()
    out = []
    for pod in pods:
        key = _shape(pod)
        if key not in seen:
            seen.add(key)
            out.append(pod)
    return out


def about_template(no: ChildRefusal) -> bool:
    """A refusal of the rendered pod itself: invalid (422), an unknown field (400 under strict
    field validation), Pod Security or another admission denial (403). Not: a full quota, a busy
    API server, a webhook that cannot take dry runs (the creates find out for themselves)."""
    if no.retryable or "does not support dry run" in no.message:
        return False
    return no.code in (400, 403, 422)


_POD_PATH = re.compile(r"(?<![\w.\-/\[])(spec|metadata)\.")


def message(no: ChildRefusal) -> str:
    """The API server's refusal with the pod's field paths as the job's (spec.template...)."""
    text = _POD_PATH.sub(r"spec.template.\1.", no.message)
    return f"the API server refused a dry run of pod {no.name} ({no.code} {no.reason}): {text}"
