"""Proxy settings: the ``PROXY_*`` environment variables, their defaults, and validation.

``proxy_config(env)`` parses a snapshot from ``flexinfer.settings.environment()`` (tests pass plain dicts);
``ProxyConfig.validate()`` applies the Go system's ``Config.Validate`` rules and raises ``ConfigError``
naming the variable. ``ENV_VARS`` is the documentation table (name, default, description). Called by
``flexinfer.assembly`` (run_proxy / run_local) and by the proxy tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flexinfer.api.units import parse_duration, quantity_bytes
from flexinfer.core.envvalues import EnvVar, bool_word
from flexinfer.core.errors import ConfigError

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("PROXY_MAX_QUEUE_SIZE", "100", "Requests that may wait for one model's activation; more → 503 queue_full."),
    EnvVar("PROXY_QUEUE_TIMEOUT", "60s", "Longest wait for a model to become Ready (with the cold-start timeout, "
           "the larger wins); then 504 timeout."),
    EnvVar("PROXY_COLD_START_TIMEOUT", "60s", "Default per-model cold-start budget."),
    EnvVar("PROXY_AUTH_ENABLED", "false", "Require `Authorization: Bearer <PROXY_AUTH_TOKEN>` on API routes."),
    EnvVar("PROXY_AUTH_TOKEN", "", "The bearer token (required when auth is enabled; never logged)."),
    EnvVar("PROXY_RATE_LIMIT_ENABLED", "false", "Token-bucket rate limits per model and globally (429)."),
    EnvVar("PROXY_RATE_LIMIT_PER_MODEL", "100", "Per-model refill rate, requests per second."),
    EnvVar("PROXY_RATE_LIMIT_BURST", "50", "Per-model bucket size."),
    EnvVar("PROXY_RATE_LIMIT_GLOBAL", "1000", "Global refill rate, requests per second."),
    EnvVar("PROXY_RATE_LIMIT_GLOBAL_BURST", "200", "Global bucket size."),
    EnvVar("PROXY_GRACEFUL_SHUTDOWN_TIMEOUT", "10m", "How long shutdown waits for in-flight requests."),
    EnvVar("PROXY_SHUTDOWN_DRAIN_DELAY", "5s", "Time between /readyz turning 503 and closing the listener."),
    EnvVar("PROXY_MAX_BODY_BYTES", "32Mi", "Largest accepted request body (bytes or a quantity); larger → 413."),
    EnvVar("PROXY_MAX_CONCURRENCY_PER_MODEL", "0", "Requests forwarded to one model at once, on top of the "
           "model's own parallel capacity (`spec.config.parallel`; 1 for llama.cpp unless set) which always "
           "applies (0 = no extra cap); excess requests wait within the queue timeout."),
    EnvVar("PROXY_LOADING_COMMENT_INTERVAL", "1.5s", "Interval of `: loading <model>` SSE comments while a "
           "streaming request waits for a cold start or swap."),
    EnvVar("PROXY_UPSTREAM_CONNECT_TIMEOUT", "10s", "Connect timeout to a model server."),
)

_DEFAULTS = {var.name: var.default for var in ENV_VARS}


@dataclass(frozen=True)
class ProxyConfig:
    """Frozen proxy settings (durations in seconds)."""

    max_queue_size: int = 100
    queue_timeout: float = 60.0
    cold_start_timeout: float = 60.0
    auth_enabled: bool = False
    auth_token: str = ""
    rate_limit_enabled: bool = False
    rate_limit_per_model: float = 100.0
    rate_limit_burst: int = 50
    rate_limit_global: float = 1000.0
    rate_limit_global_burst: int = 200
    graceful_shutdown_timeout: float = 600.0
    shutdown_drain_delay: float = 5.0
    max_body_bytes: int = 32 * 1024 * 1024
    max_concurrency_per_model: int = 0
    loading_comment_interval: float = 1.5
    upstream_connect_timeout: float = 10.0

    @property
    def wait_timeout(self) -> float:
        """How long one request may wait for activation: the larger of queue and cold-start timeouts."""
        return max(self.queue_timeout, self.cold_start_timeout)

    def validate(self) -> ProxyConfig:
        """Raise ``ConfigError`` naming the first invalid variable; return ``self`` when valid."""
        for name, bad in self._problems():
            if bad:
                raise ConfigError(name)
        return self

    def _problems(self) -> list[tuple[str, bool]]:
        rate_on = self.rate_limit_enabled
        return [
            ("PROXY_MAX_QUEUE_SIZE must be > 0", self.max_queue_size <= 0),
            ("PROXY_QUEUE_TIMEOUT must be > 0", self.queue_timeout <= 0),
            ("PROXY_COLD_START_TIMEOUT must be > 0", self.cold_start_timeout <= 0),
            ("PROXY_GRACEFUL_SHUTDOWN_TIMEOUT must be >= 0", self.graceful_shutdown_timeout < 0),
            ("PROXY_SHUTDOWN_DRAIN_DELAY must be >= 0", self.shutdown_drain_delay < 0),
            ("PROXY_AUTH_TOKEN must be set when PROXY_AUTH_ENABLED is true",
             self.auth_enabled and not self.auth_token),
            ("PROXY_RATE_LIMIT_PER_MODEL must be > 0 when rate limiting is enabled",
             rate_on and self.rate_limit_per_model <= 0),
            ("PROXY_RATE_LIMIT_BURST must be > 0 when rate limiting is enabled",
             rate_on and self.rate_limit_burst <= 0),
            ("PROXY_RATE_LIMIT_GLOBAL must be > 0 when rate limiting is enabled",
             rate_on and self.rate_limit_global <= 0),
            ("PROXY_RATE_LIMIT_GLOBAL_BURST must be > 0 when rate limiting is enabled",
             rate_on and self.rate_limit_global_burst <= 0),
            ("PROXY_MAX_BODY_BYTES must be > 0", self.max_body_bytes <= 0),
            ("PROXY_MAX_CONCURRENCY_PER_MODEL must be >= 0", self.max_concurrency_per_model < 0),
            ("PROXY_LOADING_COMMENT_INTERVAL must be > 0", self.loading_comment_interval <= 0),
            ("PROXY_UPSTREAM_CONNECT_TIMEOUT must be > 0", self.upstream_connect_timeout <= 0),
        ]


def proxy_config(env: Mapping[str, str]) -> ProxyConfig:
    """Parse the ``PROXY_*`` variables (missing → default); malformed values raise ``ConfigError``."""
    reader = _Reader(env)
    return ProxyConfig(
        max_queue_size=reader.integer("PROXY_MAX_QUEUE_SIZE"),
        queue_timeout=reader.duration("PROXY_QUEUE_TIMEOUT"),
        cold_start_timeout=reader.duration("PROXY_COLD_START_TIMEOUT"),
        auth_enabled=reader.flag("PROXY_AUTH_ENABLED"),
        auth_token=env.get("PROXY_AUTH_TOKEN", "").strip(),
        rate_limit_enabled=reader.flag("PROXY_RATE_LIMIT_ENABLED"),
        rate_limit_per_model=reader.number("PROXY_RATE_LIMIT_PER_MODEL"),
        rate_limit_burst=reader.integer("PROXY_RATE_LIMIT_BURST"),
        rate_limit_global=reader.number("PROXY_RATE_LIMIT_GLOBAL"),
        rate_limit_global_burst=reader.integer("PROXY_RATE_LIMIT_GLOBAL_BURST"),
        graceful_shutdown_timeout=reader.duration("PROXY_GRACEFUL_SHUTDOWN_TIMEOUT"),
        shutdown_drain_delay=reader.duration("PROXY_SHUTDOWN_DRAIN_DELAY"),
        max_body_bytes=reader.size("PROXY_MAX_BODY_BYTES"),
        max_concurrency_per_model=reader.integer("PROXY_MAX_CONCURRENCY_PER_MODEL"),
        loading_comment_interval=reader.duration("PROXY_LOADING_COMMENT_INTERVAL"),
        upstream_connect_timeout=reader.duration("PROXY_UPSTREAM_CONNECT_TIMEOUT"),
    )


class _Reader:
    """Reads one variable at a time, falling back to the documented default."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = env

    def _text(self, name: str) -> str:
        value = self._env.get(name, "").strip()
        return value or _DEFAULTS[name]

    def flag(self, name: str) -> bool:
        return bool_word(self._env.get(name), bool_word(_DEFAULTS[name], False))

    def integer(self, name: str) -> int:
        text = self._text(name)
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"{name}={text!r} is not an integer") from None

    def number(self, name: str) -> float:
        text = self._text(name)
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{name}={text!r} is not a number") from None

    def duration(self, name: str) -> float:
        text = self._text(name)
        try:
            return parse_duration(text)
        except ValueError:
            raise ConfigError(f"{name}={text!r} is not a duration (use e.g. 90s, 5m, 1h30m)") from None

    def size(self, name: str) -> int:
        text = self._text(name)
        try:
            return int(quantity_bytes(text))
        except ValueError:
            raise ConfigError(f"{name}={text!r} is not a byte size (use e.g. 1048576 or 32Mi)") from None
