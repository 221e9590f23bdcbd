"""The one parsing path for configuration values given as text (environment variables, ``--env-file``).

Every settings module reads its variables through an ``EnvReader``; what happens to an unparsable value is
the variable's ``Policy``:

- ``GUARD``: the setting guards access (auth, trust of incoming headers, which namespaces are served, where
  traffic goes). An unparsable value is a ``ConfigError``: start-up stops, fail closed.
- ``STRICT``: an unparsable value is a ``ConfigError`` naming the variable and the accepted form.
- ``FALLBACK``: the Go reference's contract (e.g. ``DEFAULT_FLASH_LOADER_*``): the default is used and a
  warning naming the variable, the bad value and the default goes to the reader's ``warn`` sink. A reader
  without a sink treats ``FALLBACK`` as ``STRICT``, so no value is ever dropped silently.

Words: truthy ``1,true,yes,on``; falsy ``0,false,no,off`` (case-insensitive, trimmed). Empty or unset always
means "the default". Pure (the caller passes the mapping and the sink); ``EnvVar`` is the documentation row
each settings module keeps in its ``ENV_VARS`` table.

Why not pydantic-settings: it validates a model all or nothing (one ``ValidationError`` for every bad
field), while here each variable has its own policy (a ``FALLBACK`` value keeps the Go default with a
warning while a ``GUARD`` value in the same snapshot fails closed, ``WHEN_ENABLED`` is checked only when its
subsystem is on); expressing that takes a wrap validator per field plus the warn sink threaded through
validation context, and its sources read the process environment where the core takes a snapshot. Its boolean words
are wider than the documented ones (``t``/``y``/``f``/``n``) and Go durations and quantities need custom
types anyway, so the result would not be smaller.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from flexinfer.api.units import format_duration, parse_duration, quantity_bytes
from flexinfer.core.errors import ConfigError

T = TypeVar("T")
Warn = Callable[[str], None]


class Policy(Enum):
    """What an unparsable value does (see the module docstring)."""

    GUARD = "guard"
    STRICT = "strict"
    FALLBACK = "fallback"
    WHEN_ENABLED = "when-enabled"
    """Checked only when its subsystem is on (tracing: endpoint, protocol, sampler); then a start-up error."""


class Kind(Enum):
    """How a variable's text is read (documentation, and the garbage the settings tests try)."""

    TEXT = "text"
    """Any text is valid (paths, images, names)."""
    BOOL = "bool"
    INT = "int"
    NUMBER = "number"
    DURATION = "duration"
    QUANTITY = "quantity"
    MILLIS = "millis"
    PAIRS = "pairs"
    """``k1=v1,k2=v2``."""
    CHOICE = "choice"
    URL = "url"
    ADDRESS = "address"
    JSON = "json"


ON_INVALID = {
    Policy.GUARD: "start-up error (guards access: fails closed)",
    Policy.STRICT: "start-up error",
    Policy.FALLBACK: "warning; default used",
    Policy.WHEN_ENABLED: "start-up error while tracing is on (unused, so unchecked, while off)",
}


@dataclass(frozen=True)
class EnvVar:
    """One documented environment variable. Each settings module keeps a table of these (``ENV_VARS``);
    ``flexinfer settings`` and ``docs/CONFIGURATION.md`` are built from them."""

    name: str
    default: str
    description: str
    kind: Kind = Kind.TEXT
    policy: Policy = Policy.STRICT

    @property
    def on_invalid(self) -> str:
        """What an unparsable value does, for the documentation (empty for free text)."""
        return "" if self.kind is Kind.TEXT else ON_INVALID[self.policy]


TRUTHY = frozenset({"1", "true", "yes", "on"})
FALSY = frozenset({"0", "false", "no", "off"})
BOOL_WORDS = "1/true/yes/on or 0/false/no/off"


def truth_value(value: str | None) -> bool | None:
    """Truthy/falsy word → bool; anything else (including empty) → ``None``."""
    word = (value or "").strip().lower()
    if word in TRUTHY:
        return True
    if word in FALSY:
        return False
    return None


class EnvReader:
    """Typed reads of one environment snapshot under a policy; ``warn`` receives ``FALLBACK`` warnings."""

    def __init__(self, env: Mapping[str, str], warn: Warn | None = None) -> None:
        self._env, self._warn = env, warn

    def raw(self, name: str) -> str:
        """The trimmed text of ``name`` (empty when unset)."""
        return (self._env.get(name) or "").strip()

    def text(self, name: str, default: str = "") -> str:
        return self.raw(name) or default

    def flag(self, name: str, default: bool, policy: Policy = Policy.STRICT) -> bool:
        raw = self.raw(name)
        if not raw:
            return default
        value = truth_value(raw)
        if value is None:
            return self.invalid(name, raw, f"not a boolean (use {BOOL_WORDS})", default, policy)
        return value

    def integer(self, name: str, default: int, policy: Policy = Policy.STRICT, minimum: int | None = None) -> int:
        raw = self.raw(name)
        if not raw:
            return default
        try:
            value = int(raw)
        except ValueError:
            return self.invalid(name, raw, "not an integer", default, policy)
        if minimum is not None and value < minimum:
            return self.invalid(name, raw, f"below the minimum {minimum}", default, policy)
        return value

    def number(self, name: str, default: float, policy: Policy = Policy.STRICT) -> float:
        raw = self.raw(name)
        if not raw:
            return default
        try:
            value = float(raw)
        except ValueError:
            return self.invalid(name, raw, "not a number", default, policy)
        if not math.isfinite(value):
            return self.invalid(name, raw, "not a finite number", default, policy)
        return value

    def duration(self, name: str, default: float, policy: Policy = Policy.STRICT) -> float:
        """Seconds from a Go-style duration (``90s``, ``5m``, ``1h30m``); negative durations do not parse."""
        raw = self.raw(name)
        if not raw:
            return default
        try:
            return parse_duration(raw)
        except ValueError:
            return self.invalid(name, raw, "not a duration (use e.g. 90s, 5m, 1h30m)", default, policy,
                                shown=f"using the default {format_duration(default)}")

    def quantity(self, name: str, default: str | None, policy: Policy = Policy.STRICT) -> str | None:
        """A non-negative Kubernetes quantity kept as text (``8Gi``); ``default`` when unset."""
        raw = self.raw(name)
        if not raw:
            return default
        try:
            quantity_bytes(raw)
        except ValueError:
            return self.invalid(name, raw, "not a Kubernetes quantity (use e.g. 8Gi, 512Mi, 2G)", default, policy)
        return raw

    def size(self, name: str, default: int, policy: Policy = Policy.STRICT) -> int:
        """Bytes from a plain number or a quantity (``32Mi``)."""
        raw = self.raw(name)
        if not raw:
            return default
        try:
            return quantity_bytes(raw)
        except ValueError:
            return self.invalid(name, raw, "not a byte size (use e.g. 1048576 or 32Mi)", default, policy)

    def choice(self, name: str, choices: tuple[str, ...], default: str, policy: Policy = Policy.STRICT) -> str:
        """One of ``choices`` (case-insensitive), spelled as in ``choices``."""
        raw = self.raw(name)
        if not raw:
            return default
        found = next((choice for choice in choices if choice.lower() == raw.lower()), None)
        if found is None:
            return self.invalid(name, raw, f"not one of {', '.join(choices)}", default, policy)
        return found

    def invalid(self, name: str, raw: str, problem: str, default: T, policy: Policy, *, shown: str | None = None) -> T:
        """Apply ``policy`` to an unparsable value: raise, or warn and return ``default``.

        The warning reads ``NAME='value' is <problem>; <shown>`` where ``shown`` defaults to "using the default X".
        """
        if policy is Policy.FALLBACK and self._warn is not None:
            self._warn(f"{name}={raw!r} is {problem}; {shown or f'using the default {_show(default)}'}")
            return default
        raise ConfigError(f"{name}={raw!r} is {problem}")


def _show(value: object) -> str:
    if value is None:
        return "(unset)"
    return repr(value) if isinstance(value, str) else str(value)


def quantity_or_none(value: str | None) -> str | None:
    """A quantity kept as text, or ``None`` when empty or unparsable (for resource fields already validated)."""
    text = (value or "").strip()
    if not text:
        return None
    try:
        quantity_bytes(text)
    except ValueError:
        return None
    return text


def duration_or_none(value: str | None) -> float | None:
    """A duration in seconds; empty or unparsable → ``None`` (for free-form ``spec.config`` values)."""
    text = (value or "").strip()
    if not text:
        return None
    try:
        return parse_duration(text)
    except ValueError:
        return None
