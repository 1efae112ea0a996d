"""The operator's cost model: ``--cost-model FILE``, the same YAML ``holmes plan --config`` reads
(holmes.plan.config_file), so what ``holmes plan`` prints is what the operator plans.

- Start-up: the file is read once; a missing, unreadable or invalid file raises
  :class:`ConfigError` (the operator exits 2 with the message): never a silent default.
- Afterwards it is re-read before every plan (a few KB; planning costs far more), so an edited
  ConfigMap takes effect without a restart once the kubelet has updated the mounted file
  (within about a minute). A new content is logged with the keys that changed.
- A bad edit (invalid YAML or values, file gone) keeps the last good model in use, logs one
  error per bad content and sets ``holmes_cost_model_valid`` to 0 until the file is fixed.

Reads of the file are serialised (reconciles of different jobs run in worker threads).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from holmes.plan import PlannerConfig
from holmes.plan.config_file import ConfigError, load_yaml_text, to_mapping

from . import metrics

log = logging.getLogger("holmes.operator")


def flat(doc: Any, prefix: str = "") -> dict[str, Any]:
    """{"fabric": {"socketGbps": 25}} -> {"fabric.socketGbps": 25} (lists kept whole)."""
    if not isinstance(doc, dict):
        return {prefix: doc}
    out: dict[str, Any] = {}
    for k, v in doc.items():
        out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else {f"{prefix}{k}": v})
    return out


def changes(old: PlannerConfig, new: PlannerConfig) -> list[str]:
    """The keys that differ, in file terms: ``fabric.crossClusterGbps 25.0 -> 50.0``."""
    a, b = flat(to_mapping(old)), flat(to_mapping(new))
    return [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


class CostModel:
    """The PlannerConfig the operator plans with: the defaults, or ``path``'s numbers.

    ``adjust`` is applied to every model read (the operator's NIC flags on top of the file's
    ``nicMapping``). ``config`` is the model in use (no I/O); :meth:`refresh` re-reads the file.
    """

    def __init__(self, path: str | None = None,
                 adjust: Callable[[PlannerConfig], PlannerConfig] = lambda c: c,
                 base: PlannerConfig | None = None):
        self.path, self.adjust = path, adjust
        self._lock = threading.Lock()
        self._text: str | None = None           # content of the model in use
        self._rejected: str | None = None       # the problem last reported
        if path is None:
            self.config = adjust(base or PlannerConfig())
        else:
            text = self._read()
            self.config = self._parse(text)     # ConfigError: the caller stops
            self._text = text
        metrics.COST_MODEL_VALID.set(1)

    def _read(self) -> str:
        try:
            with open(self.path, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise ConfigError(f"cannot read cost-model file {self.path}: {e.strerror}") from None

    def _parse(self, text: str) -> PlannerConfig:
        return self.adjust(load_yaml_text(text, f"cost-model file {self.path}"))

    def refresh(self) -> PlannerConfig:
        """The model to plan with now: the file's content if it changed and is valid, else the
        last good one."""
        if self.path is None:
            return self.config
        with self._lock:
            try:
                text = self._read()
                if text != self._text:
                    new = self._parse(text)
            except ConfigError as e:
                self._reject(str(e))
                return self.config
            if text == self._text:
                if self._rejected is not None:
                    log.info("cost-model file %s is valid again (unchanged from the model in use)", self.path,
                             extra={"costModel": self.path})
                    self._rejected = None
                    metrics.COST_MODEL_VALID.set(1)
                return self.config
            diff = changes(self.config, new)
            log.info("cost model reloaded from %s: %s", self.path, "; ".join(diff) or "no value changed",
                     extra={"costModel": self.path, "changes": diff})
            self.config, self._text, self._rejected = new, text, None
            metrics.COST_MODEL_RELOADS.inc()
            metrics.COST_MODEL_VALID.set(1)
            return self.config

    def _reject(self, message: str) -> None:
        metrics.COST_MODEL_VALID.set(0)
        if message != self._rejected:           # once per problem, not once per plan
            self._rejected = message
            log.error("%s -- planning keeps the last good cost model until the file is fixed", message,
                      extra={"costModel": self.path})
