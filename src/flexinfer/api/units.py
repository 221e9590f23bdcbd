"""Kubernetes-style durations (``90s``, ``5m``, ``1h30m``) and resource quantities (``8Gi``, ``500M``).

Pure parsing used by the api validators, the environment settings (``flexinfer.core.envvalues``) and the
generated CRDs: ``QUANTITY_PATTERN`` and ``DURATION_PATTERN`` are the very regular expressions the parsers
use, and the CRDs carry them as ``pattern``, so the API server rejects exactly what FlexInfer cannot parse.
Quantities are sizes here: non-negative (an optional ``+`` is accepted, as Kubernetes does).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

DURATION_PATTERN = r"^(0|([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$"
"""A Go duration without sign: ``0`` or one or more ``<number><unit>`` parts (``1h30m``, ``1.5s``)."""
QUANTITY_PATTERN = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]{1,2}|[KMGTPE]i|[numkMGTPE])?$"
"""A non-negative Kubernetes quantity: a decimal number, then an exponent or one SI / binary-SI suffix."""
_DURATION = re.compile(DURATION_PATTERN)
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0,
}
_QUANTITY = re.compile(QUANTITY_PATTERN)
_EXPONENT = re.compile(r"[eE][+-]?[0-9]{1,2}")
_QUANTITY_FACTORS = {
    None: Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}


def parse_duration(text: str) -> float:
    """Parse a Go/Kubernetes duration (``DURATION_PATTERN``, no surrounding spaces) into seconds; raise
    ``ValueError`` naming the input."""
    if text == "":
        raise ValueError("empty duration")
    if not _DURATION.fullmatch(text):
        raise ValueError(f"invalid duration {text!r} (use e.g. 90s, 5m, 1h30m)")
    return sum(float(m.group(1)) * _DURATION_UNITS[m.group(2)] for m in _DURATION_PART.finditer(text))


def format_duration(seconds: float) -> str:
    """Render seconds as a short Go-style duration (``1h2m3s``, ``500ms``)."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    out = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    return out + (f"{secs}s" if secs or not out else "")


def parse_quantity(text: str | int | float) -> Decimal:
    """Parse a non-negative Kubernetes quantity into its exact value (bytes for memory); ``ValueError`` if
    invalid. Text must match ``QUANTITY_PATTERN`` exactly (no surrounding spaces)."""
    if isinstance(text, bool):
        raise ValueError(f"invalid quantity {text!r}")
    if isinstance(text, int | float):
        if not math.isfinite(text) or text < 0:
            raise ValueError(f"invalid quantity {text!r} (must be a non-negative size)")
        return Decimal(str(text))
    match = _QUANTITY.fullmatch(text)
    if not match:
        raise ValueError(f"invalid quantity {text!r} (use e.g. 8Gi, 512Mi, 2G)")
    suffix = match.group(3)
    exponent = suffix if suffix and _EXPONENT.fullmatch(suffix) else ""
    try:
        number = Decimal(match.group(1) + exponent)
    except InvalidOperation as exc:  # pragma: no cover - regex already guards the syntax
        raise ValueError(f"invalid quantity {text!r}") from exc
    return number * _QUANTITY_FACTORS[None if exponent else suffix]


def quantity_bytes(text: str | int | float) -> int:
    """A quantity as a whole number of bytes (rounded up, as Kubernetes does for memory)."""
    value = parse_quantity(text)
    whole = int(value)
    return whole if value == whole else whole + 1


def is_quantity(text: str) -> bool:
    """True when ``text`` parses as a Kubernetes quantity."""
    try:
        parse_quantity(text)
    except ValueError:
        return False
    return True
