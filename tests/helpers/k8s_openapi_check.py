"""An object checked against a Kubernetes release's published OpenAPI v3 schema (hack/k8s_openapi.py
distills one file per release), as the release's API server would decode it with strict field
validation (kubectl's default):

- its apiVersion must be a group/version the release serves without a feature gate: one the
  release has at all and GA (every beta or alpha API the supported releases have is off by
  default), and its kind one of that group/version's kinds;
- unknown fields. The v3 documents never say ``additionalProperties: false``; they are generated
  from the Go types, so an object schema with ``properties`` lists every field of its struct, and
  the server's strict decoding refuses any other key. Such a schema is taken as closed. Open are
  only those the documents mark so: ``additionalProperties`` (maps: labels, data),
  ``x-kubernetes-preserve-unknown-fields``, and object schemas without ``properties``
  (RawExtension, FieldsV1, apiextensions' JSON), which the server does not decode field by field;
- types (integer, number, string, boolean, object, array; IntOrString and Quantity as their
  oneOf), enums and required fields. A null is accepted where the field is optional (the server
  reads it as unset). Formats (int32, date-time), patterns and CEL rules are not checked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "boolean": (bool,),
    "integer": (int,),
    "number": (int, float),
}


def _is(value: Any, kind: str) -> bool:
    return isinstance(value, _TYPES[kind]) and not (isinstance(value, bool) and kind in ("integer", "number"))


def check(value: Any, schema: Mapping[str, Any], schemas: Mapping[str, Any], path: str = "$") -> list[str]:
    """Errors of ``value`` against one schema node (empty: valid); ``schemas`` resolves $ref."""
    if "$ref" in schema:
        return check(value, schemas[schema["$ref"].rsplit("/", 1)[1]], schemas, path)
    errors: list[str] = []
    for sub in schema.get("allOf", ()):
        errors += check(value, sub, schemas, path)
    for key in ("oneOf", "anyOf"):
        if key in schema and not any(not check(value, s, schemas, path) for s in schema[key]):
            errors.append(f"{path}: {value!r} matches none of {key}")
    if schema.get("x-kubernetes-int-or-string"):
        if not (_is(value, "integer") or _is(value, "string")):
            errors.append(f"{path}: {value!r} is neither an integer nor a string")
        return errors
    kind = schema.get("type")
    if kind and not _is(value, kind):
        return [*errors, f"{path}: {value!r} is not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in {schema['enum']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        more = schema.get("additionalProperties")
        closed = bool(props) and more is None and not schema.get("x-kubernetes-preserve-unknown-fields")
        errors += [f"{path}: {k} is required" for k in schema.get("required", ()) if value.get(k) is None]
        for k, v in value.items():
            if v is None:
                continue
            if k in props:
                errors += check(v, props[k], schemas, f"{path}.{k}")
            elif closed or more is False:
                errors.append(f"{path}: unknown field {k!r}")
            elif isinstance(more, dict):
                errors += check(v, more, schemas, f"{path}.{k}")
    if isinstance(value, list) and "items" in schema:
        for i, v in enumerate(value):
            errors += check(v, schema["items"], schemas, f"{path}[{i}]")
    return errors


def check_object(obj: Mapping[str, Any], release: Mapping[str, Any]) -> list[str]:
    """Errors of a whole object against a release (hack/k8s_openapi.load): served API, schema."""
    api, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    where = f"{kind} {obj.get('metadata', {}).get('name')}"
    stability = release["groupVersions"].get(api)
    if stability is None:
        return [f"{where}: {api} is not an API of this release"]
    if stability != "ga":
        return [f"{where}: {api} is {stability}, not served without a feature gate"]
    name = release["kinds"].get(f"{api}/{kind}")
    if name is None:
        return [f"{where}: {api} has no kind {kind}"]
    return [f"{where}: {e}" for e in check(obj, release["schemas"][name], release["schemas"])]
