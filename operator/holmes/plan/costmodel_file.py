"""The cost model's numbers as a YAML file, and its reloading: `holmes plan --config
COSTMODEL.yaml`, `holmes plan --print-config`, the operator's `--cost-model FILE` and the chart's
`costModel` value all read and write this one format, so what `holmes plan` prints is what the
operator plans.

The file is a mapping of :class:`~holmes.plan.costmodel.CostModelConfig` fields with camelCase
keys (``gpuPeakTflops: 989``); nested dataclasses (``fabric``, ``nicMapping``) are nested
mappings, and fields that hold ``(key, value)`` pairs (``fabric.netEfficiency``,
``nicMapping.defaultGbps``...) are mappings that override the defaults key by key. Keys left
out keep their defaults. The fields are read from the dataclasses themselves, so a field added
to CostModelConfig is configurable (and printed) without touching this module.

Reloading (:class:`CostModelFile`, the operator's ``--cost-model``):

- Start-up: the file is read once; a missing, unreadable or invalid file raises
  :class:`CostModelError` (the operator exits 2 with the message): never a silent default.
- Afterwards it is re-read before every plan (a few KB; planning costs far more), so an edited
  ConfigMap takes effect without a restart once the kubelet has updated the mounted file
  (within about a minute). A new content is logged with the keys that changed.
- A bad edit (invalid YAML or values, file gone) keeps the last good model in use and logs one
  error per bad content; ``on_state`` hears about it (the operator's metrics).

Reads of the file are serialised (reconciles of different jobs run in worker threads).
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import re
import threading
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal, Protocol, TypeVar, Union

from holmes.contract.documents import DocumentError, parse_documents, read_text
from holmes.contract.schema import camel

from .costmodel import CostModelConfig

log = logging.getLogger("holmes.costmodel")


class _Dataclass(Protocol):
    __dataclass_fields__: ClassVar[dict[str, Any]]


_Config = TypeVar("_Config", bound=_Dataclass)  # a config section: built as its base's type


class CostModelError(ValueError):
    """A cost-model file Holmes cannot use; the message names the key and what to write."""


# ---- types --------------------------------------------------------------------------------------


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_union(tp: Any) -> bool:
    return typing.get_origin(tp) in (Union, types.UnionType)


def _pair_value_type(tp: Any) -> Any | None:
    """``tuple[tuple[str, X], ...]`` (a mapping kept as pairs) -> X, else None."""
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis and typing.get_origin(args[0]) is tuple:
            inner = typing.get_args(args[0])
            if len(inner) == 2 and inner[0] is str:
                return inner[1]
    return None


def _describe(tp: Any) -> str:
    if tp is bool:
        return "true or false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is type(None):
        return "null"
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    if _is_union(tp):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    vt = _pair_value_type(tp)
    if vt is not None:
        return f"a mapping of names to {_describe(vt)}"
    if typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0]
        if dataclasses.is_dataclass(item):
            keys = ", ".join(camel(f.name) for f in dataclasses.fields(item) if f.init)
            return f"a list of mappings of {keys}"
        return f"a list of {_describe(item)}"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return str(tp)


def _number_rules(path: str, x: float) -> None:
    """What no cost-model number may be: negative, NaN/infinite, a zero rate, an efficiency > 1."""
    where = path.lower()  # "fabric.netEfficiency.roce" is an efficiency too
    if not math.isfinite(x) or x < 0:
        raise CostModelError(f"{path}: {x} must be a finite number >= 0")
    if x == 0 and (
        re.search(r"(gbps|tflops|gib)", where) or ("efficiency" in where and "overlap" not in where)
    ):
        raise CostModelError(f"{path}: a bandwidth, FLOP rate, memory size or efficiency must be > 0")
    if "efficiency" in where and x > 1:
        raise CostModelError(f"{path}: {x} is an efficiency, a fraction in [0, 1]")


def _convert(path: str, tp: Any, value: Any, default: Any) -> Any:
    """YAML value -> the field's Python value, or CostModelError naming ``path``."""

    def wrong() -> CostModelError:
        return CostModelError(f"{path}: expected {_describe(tp)}, got {type(value).__name__} {value!r}")

    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise wrong()
        # default None: a new entry of a name -> record mapping (gpuProducts) or of a list of
        # records (fabric.links), which names all its keys
        return _build(tp, value, default, path + ".")
    if _is_union(tp):
        for arg in typing.get_args(tp):
            if arg is type(None) and value is None:
                return None
        for arg in typing.get_args(tp):
            if arg is not type(None):
                try:
                    return _convert(path, arg, value, default)
                except CostModelError:
                    pass
        raise wrong()
    if typing.get_origin(tp) is Literal:
        if value not in typing.get_args(tp) or isinstance(value, bool) != any(
            isinstance(a, bool) for a in typing.get_args(tp)
        ):
            raise wrong()
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise wrong()
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong()
        _number_rules(path, value)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong()
        _number_rules(path, float(value))
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise wrong()
        return value
    vt = _pair_value_type(tp)
    if vt is not None:
        if not isinstance(value, Mapping):
            raise wrong()
        merged = dict(default or ())
        allowed = set(merged)  # a non-empty default fixes the names (NIC kinds)
        for k, v in value.items():
            if not isinstance(k, str):
                raise CostModelError(f"{path}: key {k!r} must be a string")
            if allowed and k not in allowed:
                raise CostModelError(f"{path}: unknown name {k!r}; valid: {', '.join(sorted(allowed))}")
            merged[k] = _convert(f"{path}.{k}", vt, v, merged.get(k))
        return tuple(merged.items())
    if typing.get_origin(tp) is tuple:
        args = typing.get_args(tp)
        if not (isinstance(value, list) and len(args) == 2 and args[1] is Ellipsis):
            raise wrong()
        return tuple(_convert(f"{path}[{i}]", args[0], v, None) for i, v in enumerate(value))
    raise CostModelError(f"{path}: this field's type {tp} cannot be set from a file")


def _build(cls: type[Any], doc: Mapping[str, Any], base: _Config | None, prefix: str) -> _Config:
    """``base`` with ``doc``'s keys changed; with no base, a new record: every key without a
    default required (an optional one, gpuProducts' nvlinkGbps, keeps its default)."""
    hints = _hints(cls)
    fields = {camel(f.name): f.name for f in dataclasses.fields(cls) if f.init}
    optional = {
        camel(f.name)
        for f in dataclasses.fields(cls)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    for key in doc:
        if key not in fields:
            guess = camel(key) if isinstance(key, str) and camel(key) in fields else None
            guess = guess or next(iter(difflib.get_close_matches(str(key), list(fields), n=1)), None)
            hint = f" (did you mean {guess}?)" if guess else ""
            raise CostModelError(
                f"unknown key {prefix}{key}{hint}; valid keys"
                + (f" under {prefix[:-1]}" if prefix else "")
                + ": "
                + ", ".join(fields)
            )
    if base is None:
        missing = sorted(set(fields) - set(doc) - optional)
        if missing:
            raise CostModelError(f"{prefix[:-1]}: missing {', '.join(missing)}")
    changes = {
        fields[key]: _convert(
            prefix + key, hints[fields[key]], value, None if base is None else getattr(base, fields[key])
        )
        for key, value in doc.items()
    }
    try:
        return cls(**changes) if base is None else dataclasses.replace(base, **changes)
    except (ValueError, TypeError) as e:  # the dataclass's own checks, in file terms
        msg = re.sub(r"\b[A-Z]\w*\.(\w+)", lambda m: prefix + camel(m.group(1)), str(e))
        raise CostModelError(msg) from None


def from_mapping(doc: Any, base: CostModelConfig | None = None) -> CostModelConfig:
    """A CostModelConfig from a YAML document (the defaults, or ``base``, where keys are absent)."""
    base = base or CostModelConfig()
    if doc is None:
        return base
    if not isinstance(doc, Mapping):
        raise CostModelError(
            f"the cost-model file must be a mapping of keys to values, got {type(doc).__name__}"
        )
    return _build(CostModelConfig, doc, base, "")


# ---- JSON Schema ------------------------------------------------------------------------------


def _schema(tp: Any, default: Any) -> dict[str, Any]:
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = _hints(tp)
        return {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                camel(f.name): _schema(hints[f.name], getattr(default, f.name, None))
                for f in dataclasses.fields(tp)
                if f.init
            },
        }
    if tp is bool:
        return {"type": "boolean"}
    if tp in (int, float):
        return {"type": "integer" if tp is int else "number", "minimum": 0}
    if tp is str:
        return {"type": "string"}
    if tp is type(None):
        return {"type": "null"}
    if typing.get_origin(tp) is Literal:
        return {"enum": list(typing.get_args(tp))}
    if _is_union(tp):
        return {"anyOf": [_schema(a, None) for a in typing.get_args(tp)]}
    vt = _pair_value_type(tp)
    if vt is not None:
        names = [k for k, _ in default or ()]
        if names:  # a non-empty default fixes the names (NIC kinds)
            return {
                "type": "object",
                "additionalProperties": False,
                "properties": {k: _schema(vt, None) for k in names},
            }
        return {"type": "object", "additionalProperties": _schema(vt, None)}
    if typing.get_origin(tp) is tuple:
        return {"type": "array", "items": _schema(typing.get_args(tp)[0], None)}
    raise TypeError(f"no JSON Schema for {tp}")


def json_schema() -> dict[str, Any]:
    """JSON Schema (draft-07) of the file: its keys and value types (the Helm chart checks its
    ``costModel`` value with it). Ranges beyond ``>= 0`` are checked when the file is read."""
    return _schema(CostModelConfig, CostModelConfig())


# ---- dumping ------------------------------------------------------------------------------------


def _plain(tp: Any, value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return to_mapping(value)
    if _pair_value_type(tp) is not None:
        return {k: to_mapping(v) if dataclasses.is_dataclass(v) else v for k, v in value}
    if isinstance(value, tuple):  # a list, of records (fabric.links) or of plain values
        return [to_mapping(v) if dataclasses.is_dataclass(v) else _plain(Any, v) for v in value]
    return value


def to_mapping(cfg: Any) -> dict[str, Any]:
    """A config (or a nested dataclass of it) as the camelCase mapping :func:`from_mapping` reads."""
    hints = _hints(type(cfg))
    return {
        camel(f.name): _plain(hints[f.name], getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if f.init
    }


HEADER = """\
# Holmes cost model (CostModelConfig). Edit and pass with: holmes plan --config THIS_FILE ...
# Keys left out keep these defaults; name -> value mappings (netEfficiency, defaultGbps...)
# override key by key. Bandwidths are Gbit/s per node (all NICs of a node together);
# efficiencies are the fraction of line rate (or of peak FLOP/s) actually achieved.
"""


def dump_yaml(cfg: CostModelConfig | None = None) -> str:
    import yaml

    return HEADER + yaml.safe_dump(
        to_mapping(cfg or CostModelConfig()), sort_keys=False, default_flow_style=False
    )


def load_yaml_text(text: str, source: str = "cost-model file") -> CostModelConfig:
    try:
        docs = parse_documents(text, source)
    except DocumentError as e:
        raise CostModelError(str(e)) from None
    if len(docs) > 1:
        raise CostModelError(f"{source} holds {len(docs)} YAML documents; a cost model is one mapping")
    doc = docs[0] if docs else None
    try:
        return from_mapping(doc)
    except CostModelError as e:
        raise CostModelError(f"{source}: {e}") from None


def load_file(path: str) -> CostModelConfig:
    """The cost model in the file at ``path`` (defaults for the keys it leaves out)."""
    try:
        text = read_text(path, "cost-model file")
    except DocumentError as e:
        raise CostModelError(str(e)) from None
    return load_yaml_text(text, f"cost-model file {path}")


# ---- reloading --------------------------------------------------------------------------------


def _flat(doc: Any, prefix: str = "") -> dict[str, Any]:
    """{"fabric": {"socketGbps": 25}} -> {"fabric.socketGbps": 25} (lists kept whole)."""
    if not isinstance(doc, dict):
        return {prefix: doc}
    out: dict[str, Any] = {}
    for k, v in doc.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


def changes(old: CostModelConfig, new: CostModelConfig) -> list[str]:
    """The keys that differ, in file terms: ``fabric.crossClusterGbps 25.0 -> 50.0``."""
    a, b = _flat(to_mapping(old)), _flat(to_mapping(new))
    return [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _ignore(valid: bool, reloaded: bool) -> None:
    pass


class CostModelFile:
    """The cost model to plan with: the defaults (``path`` None, ``base`` if given), or
    ``path``'s numbers, re-read by :meth:`refresh`.

    ``adjust`` is applied to every model read (the operator's NIC flags on top of the file's
    ``nicMapping``). ``config`` is the model in use (no I/O). ``on_state(valid, reloaded)`` is
    called on every refresh and at start-up (the operator exports it as metrics).
    """

    def __init__(
        self,
        path: str | None = None,
        adjust: Callable[[CostModelConfig], CostModelConfig] = lambda c: c,
        base: CostModelConfig | None = None,
        on_state: Callable[[bool, bool], None] = _ignore,
    ):
        self.path, self.adjust, self.on_state = path, adjust, on_state
        self._lock = threading.Lock()
        self._text: str | None = None  # content of the model in use
        self._rejected: str | None = None  # the problem last reported
        if path is None:
            self.config = adjust(base or CostModelConfig())
        else:
            text = self._read(path)
            self.config = self._parse(text)  # CostModelError: the caller stops
            self._text = text
        on_state(True, False)

    def _read(self, path: str) -> str:
        try:
            return read_text(path, "cost-model file")
        except DocumentError as e:
            raise CostModelError(str(e)) from None

    def _parse(self, text: str) -> CostModelConfig:
        return self.adjust(load_yaml_text(text, f"cost-model file {self.path}"))

    def refresh(self) -> CostModelConfig:
        """The model to plan with now: the file's content if it changed and is valid, else the
        last good one."""
        if self.path is None:
            return self.config
        with self._lock:
            try:
                text = self._read(self.path)
                if text != self._text:
                    new = self._parse(text)
            except CostModelError as e:
                self._reject(str(e))
                return self.config
            if text == self._text:
                if self._rejected is not None:
                    log.info(
                        "cost-model file %s is valid again (unchanged from the model in use)",
                        self.path,
                        extra={"costModel": self.path},
                    )
                    self._rejected = None
                    self.on_state(True, False)
                return self.config
            diff = changes(self.config, new)
            log.info(
                "cost model reloaded from %s: %s",
                self.path,
                "; ".join(diff) or "no value changed",
                extra={"costModel": self.path, "changes": diff},
            )
            self.config, self._text, self._rejected = new, text, None
            self.on_state(True, True)
            return self.config

    def _reject(self, message: str) -> None:
        self.on_state(False, False)
        if message != self._rejected:  # once per problem, not once per plan
            self._rejected = message
            log.error(
                "%s -- planning keeps the last good cost model until the file is fixed",
                message,
                extra={"costModel": self.path},
            )
