"""Kubernetes resource quantities ("500m", "8Gi", "1.5e3", 2), read as the API server reads them.

The one parser on the operator side: node allocatable and pod requests (operator.core.capacity),
GPU counts (plan.discovery), DRA device memory (plan.dra). Kubernetes' grammar
(apimachinery's resource.Quantity): a signed decimal number ("5", "5.", ".5", "+1.5") and at most
one suffix, binary (Ki Mi Gi Ti Pi Ei), decimal (n u m k M G T P E) or an exponent ("e3",
"E-2"); "1E" is 10^18 and "1E3" is 1000. No spaces. Not the Kubernetes client's
``parse_quantity``: the planner is pure and imports no client, and that one also takes what the
API server refuses ("1K", "1mi", "Infinity", "1_000").
"""

from __future__ import annotations

import functools
import math
import re
from decimal import Decimal

_SUFFIX: dict[str, Decimal] = {
    **{s: Decimal(2) ** (10 * (i + 1)) for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"))},
    **{s: Decimal(10) ** e for s, e in (("n", -9), ("u", -6), ("m", -3), ("k", 3), ("M", 6))},
    **{s: Decimal(10) ** e for s, e in (("G", 9), ("T", 12), ("P", 15), ("E", 18))},
}
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<exponent>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?"
)
_FORM = "a number and at most one suffix: Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent (e3)"


class QuantityError(ValueError):
    """A value that is not a Kubernetes quantity; the message names it."""


def parse_quantity(value: str | int | float | Decimal) -> Decimal:
    """The quantity's exact value ("500m" -> 0.5, "8Gi" -> 8589934592, "1.5e3" -> 1500).

    Raises QuantityError naming the value when it is not one (a bool, a non-finite float, a
    string outside Kubernetes' grammar)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float, Decimal)):
        raise QuantityError(f"{value!r} is not a Kubernetes quantity ({_FORM}, e.g. 500m, 8Gi)")
    if isinstance(value, (int, float, Decimal)):
        if isinstance(value, (float, Decimal)) and not math.isfinite(value):
            raise QuantityError(f"{value!r} is not a Kubernetes quantity: not a finite number")
        return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    return _parse_text(value)


# Every decision reads every node's allocatable and every pod's requests: a few distinct strings,
# parsed once each (a Decimal is immutable, so the cached value is safe to share).
@functools.lru_cache(maxsize=4096)
def _parse_text(value: str) -> Decimal:
    m = _QUANTITY.fullmatch(value)
    if not m:
        raise QuantityError(f"{value!r} is not a Kubernetes quantity ({_FORM}, e.g. 500m, 8Gi)")
    number = Decimal(m["number"])
    if m["exponent"]:
        return number.scaleb(int(m["exponent"][1:]))
    return number * _SUFFIX[m["suffix"]] if m["suffix"] else number


def quantity_or_none(value: object) -> float | None:
    """The quantity as a float, or None where the value is none (or too large for a float): for
    readers that skip what they cannot use, such as an annotation someone edited by hand."""
    if not isinstance(value, (str, int, float, Decimal)):
        return None
    try:
        q = float(parse_quantity(value))
    except QuantityError:
        return None
    return q if math.isfinite(q) else None
