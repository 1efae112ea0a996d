"""What the operator would create for a job, without a cluster: ``holmes plan --pods``.

The reconciler's own first decision on an empty namespace (no pods, no ConfigMap) over the given
nodes, so the ConfigMap, the headless Service and the pods are exactly the objects the operator
would create for attempt 1 (with the same operator settings: image, ports, NIC flags), ready for
review in a GitOps pull request. Pure: objects in, objects out.
"""

from __future__ import annotations

import copy
from datetime import datetime, timezone

from holmes.plan.costmodel_file import CostModelFile

from . import placement_facts
from .core import queueing
from .core.reconcile import Observed, RestartBackoff, decide
from .core.render import RenderSettings
from .core.template import ENFORCE_LABEL


class PreviewError(ValueError):
    """The operator would create nothing now; the message is the status it would set."""


def children(
    job: dict,
    nodes: list[dict],
    settings: RenderSettings = RenderSettings(),
    cost_model: CostModelFile | None = None,
) -> list[dict]:
    """The ConfigMap, Service and pods (a Volcano PodGroup too, when the template asks for one;
    the ResourceClaimTemplates of pods that get their devices through DRA)."""
    job = copy.deepcopy(job)
    meta = job.setdefault("metadata", {})
    meta.setdefault("namespace", "default")
    meta.setdefault("uid", "preview")
    meta.setdefault("generation", 1)
    job.pop("status", None)
    obs = Observed(  # a Volcano PodGroup as once admitted (the pods wait for that: queueing.py)
        job=job,
        pods=[],
        configmap=None,
        service=None,
        nodes=nodes,
        now=datetime.now(timezone.utc),
        podgroup={"status": {"phase": queueing.PG_INQUEUE}},
        # the namespace's Pod Security level, as given (it picks the defaults Holmes fills in)
        namespace_labels={ENFORCE_LABEL: settings.pod_security},
        compute_domains=True,  # what the operator makes where NVIDIA's DRA driver serves them
    )
    facts = placement_facts.gather(cost_model or placement_facts.builtin_cost_model())
    d = decide(obs, facts, settings, RestartBackoff(0))
    if not d.create_pods:
        conds = [
            c for c in d.status.get("conditions") or [] if c.get("status") == "True" and c.get("message")
        ]
        why = "; ".join(f"{c['reason']}: {c['message']}" for c in conds) or d.status.get("phase", "no pods")
        raise PreviewError(f"the operator would create no pods now ({why})")
    first = [o for o in (d.configmap, d.service, getattr(d, "podgroup", None)) if o is not None]
    return [*first, *d.compute_domains, *d.claim_templates, *d.create_pods]


def as_list(objects: list[dict]) -> dict:
    return {"apiVersion": "v1", "kind": "List", "items": objects}
