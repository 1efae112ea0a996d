"""How GitOps tools judge a HolmesJob's health, for the tests.

- ``kstatus``: the generic rules of kstatus (sigs.k8s.io/cli-utils/pkg/kstatus), which Flux's
  health checks and `kubectl wait`-style tools use for custom resources: Terminating when a
  deletionTimestamp is set; InProgress while status.observedGeneration differs from
  metadata.generation; InProgress when Reconciling=True; Failed when Stalled=True; otherwise
  Current ("abnormal-true" conditions: their absence means all is well).
- ``argocd``: the Lua health script shipped in examples/gitops/argocd/argocd-cm-health.yaml, run
  by a Lua 5.1 interpreter (Argo CD embeds gopher-lua, a Lua 5.1) with ``obj`` set the way Argo CD
  sets it.
"""

from __future__ import annotations

from functools import lru_cache

import yaml

from tests.helpers.packaging.packaging_helpers import GITOPS

ARGOCD_CM = GITOPS / "argocd" / "argocd-cm-health.yaml"
ARGOCD_KEY = "resource.customizations.health.holmes.dev_HolmesJob"


def kstatus(obj: dict) -> tuple[str, str]:
    meta, status = obj.get("metadata") or {}, obj.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "Terminating", "Resource scheduled for deletion"
    gen, observed = meta.get("generation"), status.get("observedGeneration")
    if gen is not None and observed is not None and observed != gen:
        return (
            "InProgress",
            f"{obj.get('kind')} generation is {gen}, but latest observed generation is {observed}",
        )
    for c in status.get("conditions") or []:
        if c.get("type") == "Reconciling" and c.get("status") == "True":
            return "InProgress", c.get("message", "")
        if c.get("type") == "Stalled" and c.get("status") == "True":
            return "Failed", c.get("message", "")
    return "Current", "Resource is current"


@lru_cache(maxsize=1)
def _argocd_runtime():
    from lupa import lua51

    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    script = yaml.safe_load(ARGOCD_CM.read_text())["data"][ARGOCD_KEY]
    fn = lua.eval("function(obj) " + script + " end")
    return lua, fn


def _to_lua(lua, value):
    if isinstance(value, dict):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    return value


def argocd(obj: dict) -> tuple[str, str]:
    lua, fn = _argocd_runtime()
    hs = fn(_to_lua(lua, obj))
    return hs["status"], hs["message"]
