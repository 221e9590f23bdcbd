"""Duration and Kubernetes quantity parsing (``flexinfer.api.units``)."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flexinfer.api.units import format_duration, is_quantity, parse_duration, parse_quantity, quantity_bytes


@pytest.mark.parametrize(("text", "seconds"), [
    ("90s", 90.0), ("5m", 300.0), ("1h30m", 5400.0), ("500ms", 0.5), ("1.5h", 5400.0), ("0", 0.0), ("2h3m4s", 7384.0),
])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5", "5x", "m5", "5m junk", "-5s"])
def test_bad_durations_raise_naming_the_input(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@given(st.integers(min_value=1, max_value=10 * 24 * 3600))
def test_format_then_parse_round_trips_whole_seconds(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(("text", "value"), [
    ("8Gi", 8 * 2**30), ("512Mi", 512 * 2**20), ("2G", 2 * 10**9), ("100m", Decimal("0.1")), ("1.5Gi", 3 * 2**29),
    ("1e3", 1000), ("0", 0), ("16Ki", 16384),
])
def test_quantities(text: str, value: int | Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["abc", "8GB", "8 Gi", "Gi", "", "1.2.3"])
def test_bad_quantities(text: str) -> None:
    assert not is_quantity(text)
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(text)


def test_quantity_bytes_rounds_up_fractions() -> None:
    assert quantity_bytes("100m") == 1
    assert quantity_bytes("1Ki") == 1024


def test_binary_and_decimal_suffixes_compare_as_values() -> None:
    assert parse_quantity("1Gi") > parse_quantity("1G")
    assert parse_quantity("1024Mi") == parse_quantity("1Gi")
