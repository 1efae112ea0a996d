"""The names of a HolmesJob's children (its pods, ConfigMap and Service), the labels, annotations,
container, volume and mount names Holmes puts on them, and the hashes recording what an attempt
was launched from: one place so a pod, its ConfigMap and the operator always agree. (The names
every part of Holmes shares, the API's and the node labels', are ``holmes.contract.names``.)"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from holmes.contract.names import JOB_NAME_PATTERN, MAX_JOB_NAME

# Labels on every child (selectors and kubectl -l use these).
LABEL_JOB = "holmes.dev/job-name"
LABEL_ATTEMPT = "holmes.dev/attempt"
LABEL_NODE_RANK = "holmes.dev/node-rank"
LABEL_STAGE = "holmes.dev/stage"
LABEL_REPLICA = "holmes.dev/replica"  # acrossIslands replicas: the replica a pod's world is
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "holmes-operator"

# Annotations recording what an attempt was launched from.
ANN_ATTEMPT = "holmes.dev/attempt"
# The spec as stored at launch, runPolicy left out: equal now, nothing changed (spec_change.py
# compares on the recorded launch spec when it differs).
ANN_SPEC_HASH = "holmes.dev/spec-hash"
ANN_MODEL_HASH = "holmes.dev/model-hash"  # model alone (immutable once started)
ANN_NODE = "holmes.dev/node"
# The GPUs a pod's DRA claim holds (it has no GPU limit): what the capacity ledger counts.
ANN_CLAIM_GPUS = "holmes.dev/claim-gpus"

TRAINER_CONTAINER = "trainer"
LAYOUT_MOUNT = "/etc/holmes"
LAYOUT_FILE = "layout.json"
JOB_FILE = "job.yaml"
LAUNCH_SPEC_FILE = "launch-spec.json"  # the ConfigMap's record of the launch (spec_change.py)
LAYOUT_VOLUME = "holmes-layout"
SHM_VOLUME = "dshm"

# A pod is <job>-<attempt>-<node rank> and doubles as its DNS hostname (a 63-char label).
_DNS1035 = re.compile(JOB_NAME_PATTERN)


def pod_name(job: str, attempt: int, node_rank: int) -> str:
    return f"{job}-{attempt}-{node_rank}"


def layout_configmap_name(job: str) -> str:
    return f"{job}-layout"


def service_name(job: str) -> str:
    return job


def master_addr(job: str, namespace: str, attempt: int) -> str:
    """DNS name of the rank-0 pod through the headless Service (hostname.subdomain.ns.svc)."""
    return pod_addr(job, namespace, attempt, 0)


def pod_addr(job: str, namespace: str, attempt: int, index: int) -> str:
    """DNS name of pod ``index`` of an attempt through the headless Service."""
    return f"{pod_name(job, attempt, index)}.{service_name(job)}.{namespace}.svc"


def replica_layout_file(replica: int) -> str:
    """The ConfigMap key of replica ``replica``'s Layout (acrossIslands replicas)."""
    return f"layout-{replica}.json"


def job_name_problem(name: str) -> str | None:
    """Why a HolmesJob name cannot be used for its children, or None when it can."""
    if not _DNS1035.match(name or ""):
        return (
            f"metadata.name: {name!r} must be a DNS-1035 label (lower-case letters, digits and '-', "
            f"starting with a letter) because it names the job's Service and pod hostnames"
        )
    if len(name) > MAX_JOB_NAME:
        return (
            f"metadata.name: {name!r} is {len(name)} characters; at most {MAX_JOB_NAME} leave room for "
            f"the pod hostnames <name>-<attempt>-<rank> (63 characters at most)"
        )
    return None


def digest(obj: Any) -> str:
    """A short stable hash of a JSON-able object (key order does not matter)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def spec_hash(spec: Mapping) -> str:
    """The stored spec but runPolicy, hashed: ANN_SPEC_HASH (its meaning kept across releases,
    so that a job launched by an earlier operator compares equal)."""
    return digest({k: v for k, v in (spec or {}).items() if k != "runPolicy"})


def model_hash(spec: dict) -> str:
    return digest((spec or {}).get("model"))
