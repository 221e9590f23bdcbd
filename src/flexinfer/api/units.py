"""Kubernetes-style durations (``90s``, ``5m``, ``1h30m``) and resource quantities (``8Gi``, ``500M``).

Pure parsing used by the api validators and by ``flexinfer.core`` settings resolution.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_DURATION_UNITS = {
    "ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0,
}
_QUANTITY = re.compile(r"^([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_QUANTITY_FACTORS = {
    None: Decimal(1), "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3, "M": Decimal(10) ** 6, "G": Decimal(10) ** 9, "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15, "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10, "Mi": Decimal(2) ** 20, "Gi": Decimal(2) ** 30, "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50, "Ei": Decimal(2) ** 60,
}


def parse_duration(text: str) -> float:
    """Parse a Go/Kubernetes duration string into seconds; raise ``ValueError`` naming the input."""
    value = text.strip()
    if value in ("0", ""):
        if value == "":
            raise ValueError("empty duration")
        return 0.0
    pos, total = 0, 0.0
    for match in _DURATION_PART.finditer(value):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(value) or pos == 0:
        raise ValueError(f"invalid duration {text!r} (use e.g. 90s, 5m, 1h30m)")
    return total


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
    """Parse a Kubernetes quantity into its exact value (bytes for memory); ``ValueError`` if invalid."""
    if isinstance(text, bool):
        raise ValueError(f"invalid quantity {text!r}")
    if isinstance(text, int | float):
        return Decimal(str(text))
    match = _QUANTITY.match(text.strip())
    if not match:
        raise ValueError(f"invalid quantity {text!r} (use e.g. 8Gi, 512Mi, 2G)")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:  # pragma: no cover - regex already guards the syntax
        raise ValueError(f"invalid quantity {text!r}") from exc
    return number * _QUANTITY_FACTORS[match.group(2)]


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
