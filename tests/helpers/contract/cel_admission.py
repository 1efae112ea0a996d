"""What an API server that runs CRD validation rules (Kubernetes 1.25+) does with a HolmesJob,
played with cel-python (a CEL interpreter; the project's 1.20 test bed runs no CEL): the
schema's defaults applied first, then every ``x-kubernetes-validations`` rule on the value at its
node as ``self``; a transition rule (one that names ``oldSelf``) only on an update where the
stored object has that node too."""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import celpy

RULES = "x-kubernetes-validations"
_MISSING = object()


@cache
def program(rule: str) -> Any:
    """The rule compiled (raises celpy.CELParseError on a rule that does not parse)."""
    env = celpy.Environment()
    return env.program(env.compile(rule))


def with_defaults(schema: dict, value: Any) -> Any:
    """``value`` with the schema's defaults filled in, as the API server defaults a request: an
    explicit null of a field that is not ``nullable`` is dropped first, then defaulted."""
    value = copy.deepcopy(value)
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value and value[key] is None and not sub.get("nullable"):
                del value[key]
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
            if key in value:
                value[key] = with_defaults(sub, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [with_defaults(schema["items"], v) for v in value]
    return value


def rule_failures(schema: dict, value: Any, old: Any = _MISSING, path: str = "") -> list[str]:
    """``path: message`` of every rule ``value`` breaks (an evaluation error counts as broken, as
    the API server counts it)."""
    out: list[str] = []
    for r in schema.get(RULES, ()):
        transition = "oldSelf" in r["rule"]
        if transition and old is _MISSING:
            continue
        activation = {"self": celpy.json_to_cel(value)}
        if transition:
            activation["oldSelf"] = celpy.json_to_cel(old)
        try:
            ok = bool(program(r["rule"]).evaluate(activation))
        except celpy.CELEvalError as e:  # the API server refuses the object with the error
            out.append(f"{path}: {r['rule']}: {e.args[0]}")
            continue
        if not ok:
            out.append(f"{path}: {r['message']}")
    if isinstance(value, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in value:
                prev = old.get(key, _MISSING) if isinstance(old, dict) else _MISSING
                out += rule_failures(sub, value[key], prev, f"{path}.{key}".lstrip("."))
    return out


def decoded(value: Any) -> Any:
    """``value`` as the API server decodes the request's JSON: an integer beyond int64 becomes a
    double (a field of type integer then refuses it; a number or a preserved field keeps it)."""
    if isinstance(value, dict):
        return {k: decoded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decoded(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        return float(value)
    return value


def admit(schema: dict, obj: dict, old: dict | None = None) -> list[str]:
    """The rule failures of creating ``obj`` (or updating ``old`` to it): empty when admitted."""
    new = with_defaults(schema, decoded(obj))
    return rule_failures(schema, new, _MISSING if old is None else with_defaults(schema, decoded(old)))
