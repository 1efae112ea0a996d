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

import copy
import json
import re
from collections.abc import Iterable

from . import child_names
from .state import ChildRefusal

# pod fields that differ between the pods of one gang without changing what the API server checks
_RANK_ENV = ("NODE_RANK", "PET_NODE_RANK", "MASTER_ADDR", "PET_MASTER_ADDR", "MASTER_PORT", "PET_MASTER_PORT")


def _shape(pod: dict) -> str:
    p = copy.deepcopy(pod)
    meta = p.get("metadata") or {}
    meta.pop("name", None)
    meta.pop("labels", None)
    (meta.get("annotations") or {}).pop(child_names.ANN_NODE, None)
    spec = p.get("spec") or {}
    for key in ("hostname", "affinity"):
        spec.pop(key, None)
    for c in spec.get("containers") or []:
        c.pop("command", None)
        c.pop("ports", None)
        c["env"] = [e for e in c.get("env") or [] if e.get("name") not in _RANK_ENV]
    return json.dumps(p, sort_keys=True)


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
