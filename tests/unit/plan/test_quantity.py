"""holmes.plan.quantity: Kubernetes quantities as the API server reads them, the one parser the
operator side uses (capacity, discovery, DRA)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from holmes.plan.quantity import QuantityError, parse_quantity, quantity_or_none

# (input, value): each form apimachinery's resource.ParseQuantity accepts
ACCEPTED = [
    ("8", 8),
    (8, 8),
    ("+8", 8),
    ("-8", -8),
    ("0", 0),
    ("500m", Decimal("0.5")),
    ("100n", Decimal("1E-7")),
    ("250u", Decimal("0.00025")),
    ("1.5k", 1500),
    ("2M", 2_000_000),
    ("3G", 3 * 10**9),
    ("1T", 10**12),
    ("1P", 10**15),
    ("1E", 10**18),  # exa, not an exponent
    ("1Ki", 1024),
    ("128Mi", 128 * 2**20),
    ("80Gi", 80 * 2**30),
    ("1.5Gi", 3 * 2**29),
    ("2Ti", 2 * 2**40),
    ("1Pi", 2**50),
    ("1Ei", 2**60),
    ("1e3", 1000),
    ("1E3", 1000),
    ("1.5e3", 1500),
    ("12e-3", Decimal("0.012")),
    ("1e+2", 100),
    ("0.5", Decimal("0.5")),
    ("5.", 5),
    (".5", Decimal("0.5")),
    ("85899345920", 80 * 2**30),
    (0.25, Decimal("0.25")),
    (Decimal("2.5"), Decimal("2.5")),
]


@pytest.mark.parametrize(("text", "value"), ACCEPTED)
def test_the_forms_kubernetes_accepts(text, value):
    assert parse_quantity(text) == value


# what the API server refuses (some of which the Kubernetes client's parse_quantity takes)
REFUSED = ["", " 8Gi", "8Gi ", "8 Gi", "1K", "1ki", "1mi", "1e", "1e3Ki", "1Gib", "Gi", "1.2.3", "0x10"]
REFUSED += ["Infinity", "NaN", "1_000", "--1", "1e1.5", "m"]


@pytest.mark.parametrize("text", REFUSED)
def test_what_kubernetes_refuses_is_an_error_naming_the_value(text):
    with pytest.raises(QuantityError) as e:
        parse_quantity(text)
    assert repr(text) in str(e.value) and "Ki" in str(e.value)


@pytest.mark.parametrize("value", [True, None, float("inf"), float("nan"), Decimal("NaN"), [8]])
def test_values_that_are_no_number_are_refused(value):
    with pytest.raises(QuantityError, match="is not a Kubernetes quantity"):
        parse_quantity(value)


def test_the_lenient_reader_skips_what_is_no_quantity():
    assert quantity_or_none("500m") == 0.5
    assert quantity_or_none(8) == 8.0
    assert quantity_or_none("lots") is None
    assert quantity_or_none(True) is None
    assert quantity_or_none({"value": "8Gi"}) is None
    assert quantity_or_none("1e999") is None  # a number, but no float holds it
