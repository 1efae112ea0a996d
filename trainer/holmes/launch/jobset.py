"""The launcher's JobSet mode: in a pod of a JobSet labelled ``holmes.dev/plan: enabled``
nobody sets the rank env a HolmesJob's pods get; the pod reads its entry from Holmes' plan
instead (ConfigMap ``<jobset>-holmes-plan`` mounted at /etc/holmes, or, where the template
cannot name it (a TrainJob's runtime), a downwardAPI volume of the two annotations the operator
writes on the pod as it ungates it: docs/jobset.md).

The entry is keyed by the pod's hostname (the JobSet sets ``spec.hostname``; the container sees
it as HOSTNAME). The pod starts only after Holmes wrote the plan and ungated it, but a ConfigMap
rewritten since (a replan) reaches a mounted volume late, so the launcher waits for its entry
(``HOLMES_PLAN_WAIT`` seconds, default 120) before it gives up with exit 2.

Standard library only: it runs in the user's image.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

PLAN_ENV = "HOLMES_PLAN"
DEFAULT_PLAN = "/etc/holmes/plan.json"
LAYOUT_FILE = "layout.json"
WAIT_ENV = "HOLMES_PLAN_WAIT"


class PlanMissing(RuntimeError):
    pass


def plan_path(env: Mapping[str, str], default: str = DEFAULT_PLAN) -> Path | None:
    """The plan to read: ``$HOLMES_PLAN``, else the mounted default when it exists and the pod
    has no NODE_RANK of its own (a HolmesJob's pods have one and no plan.json)."""
    if env.get(PLAN_ENV):
        return Path(env[PLAN_ENV])
    if not env.get("NODE_RANK") and Path(default).is_file():
        return Path(default)
    return None


def hostname(env: Mapping[str, str]) -> str:
    return env.get("HOSTNAME") or socket.gethostname()


def wait_entry(
    path: Path,
    host: str,
    timeout: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The plan and this pod's entry, waiting for a late ConfigMap update."""
    end = clock() + timeout
    why = ""
    while True:
        try:
            doc = json.loads(path.read_text())
            entry = (doc.get("pods") or {}).get(host)
            if entry is not None:
                return doc, entry
            known = sorted(doc.get("pods") or {})
            why = f"{path} has no entry for this pod's hostname {host!r} (its entries: {known})"
        except (OSError, ValueError) as e:
            why = f"cannot read {path}: {e}"
        if clock() >= end:
            raise PlanMissing(
                f"{why}; waited {timeout:.0f} s. Is the JobSet labelled holmes.dev/plan: enabled, the "
                f"ConfigMap <jobset>-holmes-plan (or a downwardAPI volume of the pod's holmes.dev/plan and "
                f"holmes.dev/layout annotations) mounted at {path.parent}, and the Holmes operator running?"
            )
        sleep(2.0)


def apply(
    env: MutableMapping[str, str], doc: Mapping[str, Any], entry: Mapping[str, Any], plan: Path
) -> list[str]:
    """Set the rank env from the plan (the plan's values win: torchrun's static rendezvous
    needs every pod to agree) and the node's env where the pod sets none; notes on overrides."""
    notes = []
    rank = {
        "NNODES": str(doc["nnodes"]),
        "NPROC_PER_NODE": str(doc["nprocPerNode"]),
        "NODE_RANK": str(entry["nodeRank"]),
        "MASTER_ADDR": str(doc["masterAddr"]),
        "MASTER_PORT": str(doc["masterPort"]),
        "WORLD_SIZE": str(int(doc["nnodes"]) * int(doc["nprocPerNode"])),
        "HOLMES_LAYOUT": str(plan.parent / LAYOUT_FILE),
    }
    for k, v in rank.items():
        if env.get(k) not in (None, v):
            notes.append(f"{k}={env[k]} replaced by the plan's {v}")
        env[k] = v
    for k, v in (entry.get("env") or {}).items():
        env.setdefault(k, str(v))
    notes.append(
        f"plan entry for {entry.get('node')}: node rank {entry['nodeRank']} of {doc['nnodes']}, "
        f"stage {entry.get('stage')} on {entry.get('island')}"
    )
    return notes


def from_plan(env: MutableMapping[str, str]) -> list[str]:
    """JobSet mode when a plan is there: the env set from this pod's entry; [] otherwise."""
    path = plan_path(env)
    if path is None:
        return []
    raw = env.get(WAIT_ENV, "120")
    timeout = float(raw) if raw.replace(".", "", 1).isdigit() else 120.0
    doc, entry = wait_entry(path, hostname(env), timeout)
    return apply(env, doc, entry, path)
