"""The HolmesJob CustomResourceDefinition, made from the declarations: ``spec`` from
:class:`~holmes.contract.jobspec.JobSpec`, ``status`` from
:class:`~holmes.contract.status.JobStatus`, plus what belongs to the resource rather than to a
field (names, printer columns, the two top descriptions). ``make crd`` writes it to
crds/holmesjob.yaml (hack/gen_crd.py) and refreshes the chart's copy and deploy/install.yaml;
tests/contract/test_crd.py fails when the committed file is not :func:`render`'s output.
Pure: builds a mapping and its YAML text."""

from __future__ import annotations

import textwrap
from typing import Any

import yaml

from .jobspec import JobSpec
from .names import GROUP, KIND, PLURAL, VERSION
from .schema import object_schema, with_description
from .status import JobStatus

HEADER = """\
# GENERATED from contract/holmes/contract/{jobspec,status,podtemplate}.py by `make crd`; do not
# edit (docs/api.md#adding-a-spec-field).
# HolmesJob: train one LLM across GPU nodes whose NICs differ (InfiniBand, RoCE, Ethernet).
# apiextensions.k8s.io/v1. The x-kubernetes-validations (CEL) rules (hiddenSize divisible by
# attentionHeads, an immutable spec.model, ...) run on Kubernetes >= 1.25. Older servers do not
# know the field: apply this file there with `kubectl apply --validate=false` (the server drops
# the rules) or install the chart, which leaves them out; the operator makes the same checks
# and reports a failing one in a Stalled condition and a Warning Event
# (docs/install.md#cel-validation-rules).
"""

DESCRIPTION = (
    "HolmesJob trains a large language model with pipeline x data x tensor parallelism across GPU "
    "nodes whose network cards differ. The Holmes operator reads each node's NIC kind, plans a "
    "layout that keeps data-parallel groups on one NIC kind and lets pipeline stages cross "
    "clusters, gives slower stages fewer layers, and runs one pod per node with the matching NCCL "
    "settings."
)
SPEC_DESCRIPTION = (
    "What to train and where. runPolicy may be edited at any time; editing model is refused by "
    "the API server (1.25+), or once the job has started by the operator (Stalled); editing "
    "training, parallelism, nodes or template of an active job re-plans it and relaunches all "
    "pods as a new attempt (not counted as a restart). Edits to a finished job have no effect."
)
STATUS_DESCRIPTION = "What the operator observed and did; written by the operator only."


def _column(name: str, type_: str, path: str, description: str = "", priority: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "type": type_, "jsonPath": path}
    if priority:
        out["priority"] = priority
    if description:
        out["description"] = description
    return out


PRINTER_COLUMNS = [
    _column(
        "Phase", "string", ".status.phase", "Pending, Running, Restarting, Succeeded, Failed or Suspended."
    ),
    _column("Nodes", "integer", ".spec.nodes.count", "Number of GPU nodes the job runs on."),
    _column(
        "PxDxT",
        "string",
        ".status.layout.shape",
        "Pipeline x data x tensor parallel degrees of the layout in use.",
    ),
    _column(
        "TFLOPS/GPU",
        "number",
        ".status.progress.tflopsPerGpu",
        "Model TFLOPS per GPU reported by the trainer (Narayanan et al. formula).",
    ),
    _column(
        "Done%",
        "integer",
        ".status.progress.percentComplete",
        "Percent of training.iterations done.",
    ),
    _column(
        "ETA",
        "string",
        ".status.progress.estimatedRemaining",
        "Estimated time left, at the iteration rate measured in the current attempt.",
    ),
    _column(
        "Size",
        "integer",
        ".status.size.current",
        "Nodes the current attempt runs on (below Nodes while an elastic job runs smaller).",
        priority=1,
    ),
    _column(
        "Restarts",
        "integer",
        ".status.restarts",
        "Gang restarts, all reasons (status.restartsByReason breaks them down).",
        priority=1,
    ),
    _column(
        "Iteration",
        "integer",
        ".status.progress.iteration",
        "Last training iteration the trainer reported.",
        priority=1,
    ),
    _column("Age", "date", ".metadata.creationTimestamp"),
]


def openapi_schema() -> dict[str, Any]:
    """The version's openAPIV3Schema."""
    spec = object_schema(JobSpec)
    status = object_schema(JobStatus)
    return {
        "type": "object",
        "description": DESCRIPTION,
        "required": ["spec"],
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "APIVersion defines the versioned schema of this representation of an object.",
            },
            "kind": {
                "type": "string",
                "description": (
                    "Kind is a string value representing the REST resource this object represents."
                ),
            },
            "metadata": {"type": "object"},
            "spec": with_description(spec, SPEC_DESCRIPTION),
            "status": with_description(status, STATUS_DESCRIPTION),
        },
    }


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{PLURAL}.{GROUP}",
            "labels": {"app.kubernetes.io/name": "holmes", "app.kubernetes.io/component": "crd"},
            # Argo CD prunes (or deletes with the Application) whatever leaves the rendered set,
            # whatever Helm's keep policy says: deleting the CRD deletes every HolmesJob.
            "annotations": {"argocd.argoproj.io/sync-options": "Prune=false,Delete=false"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["hj"],
                "categories": ["all", "holmes"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


# ---- YAML as a person would write it: block mappings, lists of scalars inline (one per line
# when they do not fit), a text that
# does not fit on its key's line folded (>-) at 100 columns ---------------------------------

WIDTH = 100


def _inline(value: Any) -> str:
    """A scalar, or a list of scalars, in YAML's flow style (quoted where YAML 1.1 needs it)."""
    text = yaml.safe_dump([value], default_flow_style=True, width=1 << 30).strip()
    return text[1:-1]  # the list around it


def _block(obj: dict[str, Any], indent: int) -> list[str]:
    pad = " " * indent
    lines = []
    for key, value in obj.items():
        head = f"{pad}{key}:"
        if isinstance(value, dict) and value:
            lines += [head, *_block(value, indent + 2)]
        elif isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
            lines.append(head)
            for item in value:
                first, *rest = _block(item, indent + 4)
                lines += [f"{pad}  - {first.lstrip()}", *rest]
        elif isinstance(value, list) and value and len(head) + 1 + len(_inline(value)) > WIDTH:
            lines += [head, *(f"{pad}  - {_inline(x)}" for x in value)]  # a long enum: one per line
        elif isinstance(value, str) and len(head) + 1 + len(_inline(value)) > WIDTH:
            wrapped = textwrap.wrap(value, WIDTH - indent - 2, break_long_words=False, break_on_hyphens=False)
            lines += [f"{head} >-", *(f"{pad}  {line}" for line in wrapped)]
        else:
            lines.append(f"{head} {_inline(value)}")
    return lines


def render() -> str:
    """crds/holmesjob.yaml's text."""
    doc = crd()
    text = HEADER + "\n".join(_block(doc, 0)) + "\n"
    if yaml.safe_load(text) != doc:  # a doc string YAML cannot fold back (two spaces, a newline)
        raise ValueError("the CRD's YAML does not read back as the declarations: check the docs' whitespace")
    return text
