"""A small validator for the strict JSON Schemas that kubernetes-validate generates from the
Kubernetes OpenAPI (tests/*/data/k8s-*-schemas.json): the kinds of schema those files use
($ref into their $defs, oneOf, type lists with null, enum, required, additionalProperties false
for unknown fields), nothing more."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

KINDS: dict[str, Any] = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is(value: Any, kind: str) -> bool:
    if kind in KINDS:
        return isinstance(value, KINDS[kind])
    numbers = (int, float) if kind == "number" else (int,)
    return isinstance(value, numbers) and not isinstance(value, bool)


def check(value: Any, schema: Mapping[str, Any], defs: Mapping[str, Any], path: str = "$") -> list[str]:
    """Errors of ``value`` against ``schema`` (empty: valid); ``defs`` resolves $ref."""
    if "$ref" in schema:
        return check(value, defs[schema["$ref"].rsplit("/", 1)[1]], defs, path)
    if "oneOf" in schema:
        ok = any(not check(value, s, defs, path) for s in schema["oneOf"])
        return [] if ok else [f"{path}: matches no oneOf"]
    types = schema.get("type")
    types = [types] if isinstance(types, str) else types or []
    if types and not any(_is(value, t) for t in types):
        return [f"{path}: {value!r} is not {'/'.join(types)}"]
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        errors += [f"{path}: {k} is required" for k in schema.get("required", []) if k not in value]
        for k, v in value.items():
            if k in props:
                errors += check(v, props[k], defs, f"{path}.{k}")
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: unknown field {k}")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += check(v, schema["additionalProperties"], defs, f"{path}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            errors += check(v, schema["items"], defs, f"{path}[{i}]")
    return errors
