"""Parsing rules for configuration values given as text (environment variables, Helm-rendered env).

The Go system's rules: truthy ``1,true,yes,on``; falsy ``0,false,no,off`` (case-insensitive, trimmed);
anything else falls back to the default. Pure; callers pass the value they read.
"""

from __future__ import annotations

from dataclasses import dataclass

from flexinfer.api.units import parse_duration, quantity_bytes


@dataclass(frozen=True)
class EnvVar:
    """One documented environment variable: name, default (as text) and meaning. Each settings module keeps
    a table of these (``ENV_VARS``); ``flexinfer settings`` and ``docs/CONFIGURATION.md`` are built from them."""

    name: str
    default: str
    description: str


TRUTHY = frozenset({"1", "true", "yes", "on"})
FALSY = frozenset({"0", "false", "no", "off"})


def bool_word(value: str | None, default: bool) -> bool:
    """Truthy/falsy word → bool; unknown or missing → ``default``."""
    word = (value or "").strip().lower()
    if word in TRUTHY:
        return True
    if word in FALSY:
        return False
    return default


def positive_int(value: str | None, default: int) -> int:
    """A positive integer; non-numeric or ≤ 0 → ``default``."""
    try:
        number = int((value or "").strip())
    except ValueError:
        return default
    return number if number > 0 else default


def quantity_or_none(value: str | None) -> str | None:
    """A Kubernetes quantity kept as text; empty or unparsable → ``None``."""
    text = (value or "").strip()
    if not text:
        return None
    try:
        quantity_bytes(text)
    except ValueError:
        return None
    return text


def duration_or_none(value: str | None) -> float | None:
    """A duration in seconds; empty or unparsable → ``None``."""
    text = (value or "").strip()
    if not text:
        return None
    try:
        return parse_duration(text)
    except ValueError:
        return None
