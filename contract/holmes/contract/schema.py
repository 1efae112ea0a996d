"""Declaring a field of the HolmesJob API once, and the two things made from that declaration:
the reader that turns a manifest into the dataclasses (with one problem line per bad field) and
the OpenAPI v3 schema of the CRD (hack/crdgen, ``make crd``).

A field is a dataclass field whose type is ``Annotated[T, Field("its one-line doc", ...)]``; its
default is the dataclass default, its manifest key the camelCase of its name. From ``T`` and the
``Field`` both sides follow:

- ``int``, ``float``, ``bool``, ``str`` (``enum=`` for a closed set), ``X | None``, a nested
  dataclass, ``tuple[X, ...]`` (a list), ``dict[str, X]`` (a map; ``dict[str, Any]`` keeps any
  content);
- ``minimum``/``maximum``/``exclusive_minimum``, ``min_items``/``max_items``: bounds checked by
  both the reader and the API server; a spec string is never empty;
- a field without a default is required; a scalar default is also the API server's
  (``default:`` in the CRD) unless ``server_default=False``, an object's default there is ``{}``;
- ``rules=`` (on a field) and a ``RULES`` class attribute (on a dataclass, for checks across its
  fields): CEL rules (:class:`Rule`) the API server checks at admission, Kubernetes 1.25+. An
  integer field with ``words`` gets its rule from the declaration (the schema alone cannot bound
  an int-or-string). The reader, or the spec's cross checks, make each check too: older servers
  and the operator rely on those.

What no declaration can say (a value whose meaning depends on another field, a legacy form, a
manifest shape that differs from the dataclass) is a ``read=`` function next to the dataclass:
it gets the reader, the raw value (``None`` when absent), the field's path and the fields
already read in the same object, and returns the value or :data:`INVALID` after adding a
problem. ``schema=`` then states the CRD's form (a dict, or a dataclass whose fields declare it).
Pure Python, standard library only.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass
from typing import Any, Union

INVALID: Any = object()  # what a reader returns for a value it reported as a problem


class _Absent:
    """A field not given in the manifest (``null`` counts as not given, as the API server
    prunes nulls of non-nullable fields)."""


ABSENT: Any = _Absent()

ReadHook = Callable[["Reader", Any, str, Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Rule:
    """One CEL rule of the CRD (``x-kubernetes-validations``), checked by the API server at
    admission from Kubernetes 1.25 on. ``rule`` sees the value as ``self`` (a transition rule
    also its stored value as ``oldSelf``, and runs on updates only); ``message`` names the field
    and the fix, as the reader's problems do. Only ``rule`` and ``message``: the fields 1.25
    knows (``messageExpression`` is 1.27+, ``reason``/``fieldPath`` 1.28+)."""

    rule: str
    message: str


@dataclass(frozen=True)
class Field:
    """One field's declaration: the doc the CRD's description (``kubectl explain``) shows, and
    what values it takes. See the module docstring."""

    doc: str
    enum: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False  # minimum itself is not allowed (a positive number)
    words: tuple[str, ...] = ()  # an integer field that also takes these strings ("auto")
    min_items: int | None = None
    max_items: int | None = None
    nullable: bool = False  # the API server keeps an explicit null (the reader reads it as absent)
    server_default: bool = True  # False: the reader alone applies the default
    preserve_unknown: bool = False  # the object (or each list item) keeps fields not declared
    format: str | None = None  # an OpenAPI string format, e.g. date-time
    key: str | None = None  # the manifest key when not camel(name)
    read: ReadHook | None = None
    schema: Mapping[str, Any] | type | None = None
    rules: tuple[Rule, ...] = ()  # CEL rules on this field's value (see Rule)


def camel(name: str) -> str:
    """snake_case field name -> the camelCase key of the manifest (and of the cost-model file)."""
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


@dataclass(frozen=True)
class Declared:
    """A dataclass field with its declaration, as the reader and the generator see it."""

    name: str
    key: str
    type: Any  # the annotation without Annotated and without None
    optional: bool  # the annotation allows None
    spec: Field
    default: Any  # MISSING when required; a default_factory's value otherwise

    @property
    def required(self) -> bool:
        return self.default is MISSING


@functools.cache
def declared(cls: type) -> list[Declared]:
    """The fields of a declared dataclass in order; a field without a ``Field`` is a programming
    error (every field of the API is documented)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        specs = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Field)]
        if len(specs) != 1:
            raise TypeError(f"{cls.__name__}.{f.name}: declare it as Annotated[type, Field(doc, ...)]")
        tp = typing.get_args(hint)[0]
        tp, optional = _without_none(tp)
        default: Any = f.default
        if f.default_factory is not MISSING:
            default = f.default_factory()
        out.append(Declared(f.name, specs[0].key or camel(f.name), tp, optional, specs[0], default))
    return out


def _without_none(tp: Any) -> tuple[Any, bool]:
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) < len(typing.get_args(tp)):
            return (args[0] if len(args) == 1 else Union[tuple(args)]), True
    return tp, False


# ---- the reader ---------------------------------------------------------------------------


# The API server holds a JSON integer as an int64: a larger one in an integer field is refused.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def is_int(v: Any) -> bool:
    """An integer the API server can hold (Python's are unbounded)."""
    return isinstance(v, int) and not isinstance(v, bool) and INT64_MIN <= v <= INT64_MAX


def show(v: Any) -> str:
    """A value as a problem line quotes it."""
    if v is None:
        return "null"
    if isinstance(v, Mapping):
        return "a mapping"
    if isinstance(v, (list, tuple)):
        return "a list"
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


class Reader:
    """Reads declared dataclasses from a manifest, collecting every problem instead of stopping
    at the first; each problem line starts with the field's path and says what to do."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def add(self, path: str, what: str) -> None:
        self.problems.append(f"{path}: {what}")

    def mapping(
        self, v: Any, path: str, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()
    ) -> Mapping[str, Any] | None:
        """``v`` as a mapping with only the known keys (unknown and missing ones reported)."""
        if not isinstance(v, Mapping):
            self.add(path, f"must be a mapping, got {show(v)}")
            return None
        allowed = set(required) | set(optional)
        unknown = sorted(str(k) for k in v if k not in allowed)
        if unknown:
            known = ", ".join(list(required) + list(optional)) or "no fields"
            self.add(
                path,
                f"unknown field{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                f"(known: {known}); remove or fix the spelling",
            )
        for k in required:
            if v.get(k) is None:
                self.add(f"{path}.{k}", "required field is missing")
        return v

    def object(self, cls: type, v: Any, path: str, defaults: Mapping[str, Any] | None = None) -> Any:
        """An instance of the declared dataclass ``cls`` from the mapping ``v``, or INVALID.
        ``defaults`` replaces the declared default of some fields (by name)."""
        fields = declared(cls)
        d = self.mapping(
            v,
            path,
            required=tuple(f.key for f in fields if f.required),
            optional=tuple(f.key for f in fields if not f.required),
        )
        if d is None:
            return INVALID
        values: dict[str, Any] = {}
        ok = True
        for f in fields:
            raw = d.get(f.key)
            value = self.field(f, raw, f"{path}.{f.key}", values)
            if value is INVALID:
                ok = False
            elif value is not ABSENT:
                values[f.name] = value
            elif defaults and f.name in defaults:
                values[f.name] = defaults[f.name]
        return cls(**values) if ok else INVALID

    def field(self, f: Declared, raw: Any, path: str, siblings: Mapping[str, Any]) -> Any:
        """One field's value, ABSENT (not given: the default applies) or INVALID."""
        if f.spec.read is not None:
            return f.spec.read(self, raw, path, siblings)
        if raw is None:
            return INVALID if f.required else ABSENT  # a missing required field: mapping() said so
        return self.value(f.type, f.spec, raw, path)

    def value(self, tp: Any, spec: Field, v: Any, path: str) -> Any:
        """``v`` checked against the type ``tp`` and the declaration ``spec``, or INVALID."""
        if tp is bool:
            if isinstance(v, bool):
                return v
            return self._bad(path, "must be true or false", v)
        if tp is int or spec.words:  # an integer, or one of the words ("auto")
            if isinstance(v, str) and v in spec.words:
                return v
            if is_int(v) and _within(v, spec):
                return v
            hint = " (a string: remove the quotes)" if isinstance(v, str) and _digits(v) else ""
            if isinstance(v, int) and not isinstance(v, bool) and _within(v, spec):
                bound = f"at most {INT64_MAX}" if v > 0 else f"at least {INT64_MIN}"
                hint = f" (beyond the API server's int64: {bound})"
            return self._bad(path, f"must be {_integer_kind(spec)}", v, hint)
        if tp is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            if ok and _within(v, spec):
                return float(v)
            hint = ""
            if isinstance(v, str) and _is_float(v):
                hint = " (a string: YAML 1.1 reads 3e-4 as text, write 3.0e-4)"
            return self._bad(path, f"must be {_number_kind(spec)}", v, hint)
        if tp is str:
            if spec.enum:
                if v in spec.enum:
                    return v
                hint = ""
                if isinstance(v, bool) and "off" in spec.enum:  # YAML 1.1 reads a bare off/no as false
                    hint = ' (YAML reads a bare off as false: write "off" in quotes)'
                return self._bad(path, f"must be one of {', '.join(spec.enum)}", v, hint)
            if isinstance(v, str) and v:
                return v
            return self._bad(path, "must be a non-empty string", v)
        if _is_class(tp):
            return self.object(tp, v, path)
        if typing.get_origin(tp) is tuple:
            return self._list(typing.get_args(tp)[0], spec, v, path)
        raise TypeError(f"{path}: the reader has no rule for {tp!r}; give the field a read= function")

    def _list(self, item: Any, spec: Field, v: Any, path: str) -> Any:
        if not isinstance(v, (list, tuple)) or len(v) < (spec.min_items or 0):
            what = "non-empty list" if spec.min_items else "list"
            if _is_class(item):
                of = "{" + ", ".join(f.key for f in declared(item)) + "}"
            else:
                of = {str: "strings", int: "integers", float: "numbers"}[item]
            return self._bad(path, f"must be a {what} of {of}", v)
        out = [self.value(item, Field(""), x, f"{path}[{i}]") for i, x in enumerate(v)]
        return INVALID if any(x is INVALID for x in out) else tuple(out)

    def _bad(self, path: str, what: str, v: Any, hint: str = "") -> Any:
        self.add(path, f"{what}, got {show(v)}{hint}")
        return INVALID


def _is_class(tp: Any) -> typing.TypeGuard[type]:
    """A nested declared dataclass (read and documented field by field)."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _within(v: float, spec: Field) -> bool:
    if spec.minimum is not None and (v < spec.minimum or (spec.exclusive_minimum and v == spec.minimum)):
        return False
    return spec.maximum is None or v <= spec.maximum


def _integer_kind(spec: Field) -> str:
    low, high = spec.minimum, spec.maximum
    if low == 1 and high is None:
        kind = "a positive integer"
    elif low is not None and high is not None:
        kind = f"an integer from {_number(low)} to {_number(high)}"
    elif low is not None:
        kind = f"an integer >= {_number(low)}"
    else:
        kind = "an integer" if high is None else f"an integer <= {_number(high)}"
    return kind + "".join(f' or "{w}"' for w in spec.words)


def _number_kind(spec: Field) -> str:
    if spec.minimum == 0:
        return "a positive number" if spec.exclusive_minimum else "a non-negative number"
    if spec.minimum is None:
        return "a number"
    return f"a number {'>' if spec.exclusive_minimum else '>='} {_number(spec.minimum)}"


def _digits(v: str) -> bool:
    return v.strip().lstrip("-").isdigit()


def _is_float(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


# ---- the OpenAPI v3 schema ----------------------------------------------------------------

PRESERVE = {"x-kubernetes-preserve-unknown-fields": True}

T = typing.TypeVar("T")
_DOCUMENTED_ONLY: set[type] = set()


def documented(cls: type[T]) -> type[T]:
    """Marks a dataclass declared for the CRD only (the status, the pod template): Holmes writes
    or passes it on but never reads it with :class:`Reader`, so its strings may be empty."""
    _DOCUMENTED_ONLY.add(cls)
    return cls


def object_schema(cls: type, *, preserve_unknown: bool = False) -> dict[str, Any]:
    """The structural schema of a declared dataclass. Strings the reader reads are never empty
    (so the API server refuses empty ones too); those of a :func:`documented` class may be."""
    fields = declared(cls)
    spec = cls not in _DOCUMENTED_ONLY
    out: dict[str, Any] = {"type": "object"}
    if preserve_unknown:
        out.update(PRESERVE)
    required = [f.key for f in fields if f.required]
    if required:
        out["required"] = required
    out["properties"] = {f.key: field_schema(f, spec=spec) for f in fields}
    return with_rules(out, getattr(cls, "RULES", ()))


RULES_KEY = "x-kubernetes-validations"


def with_rules(schema: Mapping[str, Any], rules: tuple[Rule, ...] | list[Rule]) -> dict[str, Any]:
    """``schema`` with ``rules`` added to its CEL rules."""
    out = dict(schema)
    if rules:
        out[RULES_KEY] = [*out.get(RULES_KEY, ()), *({"rule": r.rule, "message": r.message} for r in rules)]
    return out


def field_schema(f: Declared, *, spec: bool = True) -> dict[str, Any]:
    s = f.spec
    if isinstance(s.schema, Mapping):
        out = dict(s.schema)
    elif isinstance(s.schema, type):
        out = object_schema(s.schema, preserve_unknown=s.preserve_unknown)
    else:
        out = _type_schema(f.type, s, spec=spec)
    if _server_default(f):
        out["default"] = {} if dataclasses.is_dataclass(f.default) else f.default
    if s.nullable:
        out["nullable"] = True
    return with_description(with_rules(out, s.rules), s.doc)


def with_description(schema: Mapping[str, Any], doc: str) -> dict[str, Any]:
    """``schema`` with its description after the field's own keys, before its sub-fields (where
    a reader of the YAML looks for it)."""
    nested = (RULES_KEY, "required", "properties", "items", "additionalProperties")
    out = {k: v for k, v in schema.items() if k not in nested}
    out["description"] = doc
    out.update((k, v) for k, v in schema.items() if k in nested)
    return out


def _type_schema(tp: Any, s: Field, *, spec: bool) -> dict[str, Any]:
    if tp is bool:
        return {"type": "boolean"}
    if s.words:
        return with_rules({"x-kubernetes-int-or-string": True}, [words_rule(s)])
    if tp in (int, float):
        out: dict[str, Any] = {"type": "integer" if tp is int else "number"}
        if s.exclusive_minimum:
            out["exclusiveMinimum"] = True
        if s.minimum is not None:
            out["minimum"] = _number(s.minimum)
        if s.maximum is not None:
            out["maximum"] = _number(s.maximum)
        return out
    if tp is str:
        out = {"type": "string"}
        if s.enum:
            out["enum"] = list(s.enum)
        elif spec:
            out["minLength"] = 1
        if s.format:
            out["format"] = s.format
        return out
    if _is_class(tp):
        return object_schema(tp, preserve_unknown=s.preserve_unknown)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is tuple:
        item = Field("", preserve_unknown=s.preserve_unknown)
        out = {"type": "array"}
        if s.min_items is not None:
            out["minItems"] = s.min_items
        if s.max_items is not None:
            out["maxItems"] = s.max_items
        out["items"] = _type_schema(args[0], item, spec=spec)
        return out
    if origin is dict:
        if args[1] is Any:
            return {"type": "object", **PRESERVE}
        return {"type": "object", "additionalProperties": _type_schema(args[1], Field(""), spec=spec)}
    raise TypeError(f"no OpenAPI rule for {tp!r}; give the field a schema=")


def words_rule(s: Field) -> Rule:
    """An int-or-string field's CEL rule: one of its words, or an integer within its bounds."""
    words = ", ".join(f"'{w}'" for w in s.words)
    bounds = [f"self >= {_number(s.minimum)}"] if s.minimum is not None else []
    bounds += [f"self <= {_number(s.maximum)}"] if s.maximum is not None else []
    number = " && ".join(bounds) or "true"
    return Rule(f"type(self) == string ? self in [{words}] : {number}", f"must be {_integer_kind(s)}")


def _server_default(f: Declared) -> bool:
    d = f.default
    if not f.spec.server_default or d is MISSING or d is None:
        return False
    if dataclasses.is_dataclass(d):
        return True
    if isinstance(d, bool) or (isinstance(d, str) and (not f.spec.enum or d in f.spec.enum)):
        return True
    if isinstance(d, (int, float)):  # a default outside the bounds means "not given" (0 for kvHeads)
        return _within(d, f.spec)
    return False


def _number(v: float) -> int | float:
    return int(v) if float(v).is_integer() else v
