"""Proxy settings: the ``PROXY_*`` environment variables, their defaults, and validation.

``proxy_config(env)`` parses a snapshot from ``flexinfer.settings.environment()`` (tests pass plain dicts)
through ``flexinfer.core.envvalues.EnvReader``: every unparsable value is a ``ConfigError`` naming the
variable (``PROXY_AUTH_ENABLED`` guards access and fails closed). ``ProxyConfig.validate()`` applies the Go
system's ``Config.Validate`` rules and raises ``ConfigError`` naming the variable. ``ENV_VARS`` is the
documentation table (name, default, description, kind, policy). Called by ``flexinfer.assembly`` (run_proxy /
run_local) and by the proxy tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flexinfer.core.envvalues import EnvReader, EnvVar, Kind, Policy
from flexinfer.core.errors import ConfigError

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("PROXY_MAX_QUEUE_SIZE", "100", "Requests that may wait for one model's activation; more → 503 "
           "queue_full.", Kind.INT),
    EnvVar("PROXY_QUEUE_TIMEOUT", "60s", "Longest wait for a model to become Ready (with the cold-start timeout, "
           "the larger wins); then 504 timeout.", Kind.DURATION),
    EnvVar("PROXY_COLD_START_TIMEOUT", "60s", "Default per-model cold-start budget.", Kind.DURATION),
    EnvVar("PROXY_STALL_TIMEOUT", "120s", "In a cluster: a cold start whose weights load (`LoadingWeights`) "
           "shows no progress in the Model's status for this long is stalled; its waiting requests get 503 "
           "activation_failed.", Kind.DURATION),
    EnvVar("PROXY_AUTH_ENABLED", "false", "Require `Authorization: Bearer <PROXY_AUTH_TOKEN>` on API routes.",
           Kind.BOOL, Policy.GUARD),
    EnvVar("PROXY_AUTH_TOKEN", "", "The bearer token (required when auth is enabled; never logged)."),
    EnvVar("PROXY_RATE_LIMIT_ENABLED", "false", "Token-bucket rate limits per model and globally (429).", Kind.BOOL),
    EnvVar("PROXY_RATE_LIMIT_PER_MODEL", "100", "Per-model refill rate, requests per second.", Kind.NUMBER),
    EnvVar("PROXY_RATE_LIMIT_BURST", "50", "Per-model bucket size.", Kind.INT),
    EnvVar("PROXY_RATE_LIMIT_GLOBAL", "1000", "Global refill rate, requests per second.", Kind.NUMBER),
    EnvVar("PROXY_RATE_LIMIT_GLOBAL_BURST", "200", "Global bucket size.", Kind.INT),
    EnvVar("PROXY_GRACEFUL_SHUTDOWN_TIMEOUT", "10m", "How long shutdown waits for in-flight requests.",
           Kind.DURATION),
    EnvVar("PROXY_SHUTDOWN_DRAIN_DELAY", "5s", "Time between /readyz turning 503 and closing the listener.",
           Kind.DURATION),
    EnvVar("PROXY_MAX_BODY_BYTES", "32Mi", "Largest accepted request body (bytes or a quantity); larger → 413.",
           Kind.QUANTITY),
    EnvVar("PROXY_MAX_CONCURRENCY_PER_MODEL", "0", "Requests forwarded to one model at once, on top of the "
           "model's own parallel capacity (`spec.config.parallel`; 1 for llama.cpp unless set) which always "
           "applies (0 = no extra cap); excess requests wait in the model's one queue, under the same budget as "
           "a request waiting for a cold start or swap.", Kind.INT),
    EnvVar("PROXY_LOADING_COMMENT_INTERVAL", "1.5s", "Interval of the SSE comments a waiting streaming request "
           "gets: `: loading <model>` during a cold start or swap, `: queued for <model>` while the model's "
           "places are taken.", Kind.DURATION),
    EnvVar("PROXY_UPSTREAM_CONNECT_TIMEOUT", "10s", "Connect timeout to a model server (also the longest wait "
           "for a free connection when `PROXY_UPSTREAM_MAX_CONNECTIONS` are in use).", Kind.DURATION),
    EnvVar("PROXY_UPSTREAM_MAX_CONNECTIONS", "1024", "Connections open to one model server at once (0 = no limit); "
           "more requests wait for a connection to come free, so a burst (a queue released when a cold model "
           "becomes Ready) reuses keep-alive connections instead of overflowing the server's accept queue.",
           Kind.INT),
)


@dataclass(frozen=True)
class ProxyConfig:
    """Frozen proxy settings (durations in seconds)."""

    max_queue_size: int = 100
    queue_timeout: float = 60.0
    cold_start_timeout: float = 60.0
    stall_timeout: float = 120.0
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
    upstream_max_connections: int = 1024

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
            ("PROXY_STALL_TIMEOUT must be > 0", self.stall_timeout <= 0),
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
            ("PROXY_UPSTREAM_MAX_CONNECTIONS must be >= 0", self.upstream_max_connections < 0),
        ]


def proxy_config(env: Mapping[str, str]) -> ProxyConfig:
    """Parse the ``PROXY_*`` variables (missing → default); unparsable values raise ``ConfigError``."""
    read, default = EnvReader(env), ProxyConfig()
    return ProxyConfig(
        max_queue_size=read.integer("PROXY_MAX_QUEUE_SIZE", default.max_queue_size),
        queue_timeout=read.duration("PROXY_QUEUE_TIMEOUT", default.queue_timeout),
        cold_start_timeout=read.duration("PROXY_COLD_START_TIMEOUT", default.cold_start_timeout),
        stall_timeout=read.duration("PROXY_STALL_TIMEOUT", default.stall_timeout),
        auth_enabled=read.flag("PROXY_AUTH_ENABLED", default.auth_enabled, Policy.GUARD),
        auth_token=read.text("PROXY_AUTH_TOKEN"),
        rate_limit_enabled=read.flag("PROXY_RATE_LIMIT_ENABLED", default.rate_limit_enabled),
        rate_limit_per_model=read.number("PROXY_RATE_LIMIT_PER_MODEL", default.rate_limit_per_model),
        rate_limit_burst=read.integer("PROXY_RATE_LIMIT_BURST", default.rate_limit_burst),
        rate_limit_global=read.number("PROXY_RATE_LIMIT_GLOBAL", default.rate_limit_global),
        rate_limit_global_burst=read.integer("PROXY_RATE_LIMIT_GLOBAL_BURST", default.rate_limit_global_burst),
        graceful_shutdown_timeout=read.duration("PROXY_GRACEFUL_SHUTDOWN_TIMEOUT", default.graceful_shutdown_timeout),
        shutdown_drain_delay=read.duration("PROXY_SHUTDOWN_DRAIN_DELAY", default.shutdown_drain_delay),
        max_body_bytes=read.size("PROXY_MAX_BODY_BYTES", default.max_body_bytes),
        max_concurrency_per_model=read.integer("PROXY_MAX_CONCURRENCY_PER_MODEL", default.max_concurrency_per_model),
        loading_comment_interval=read.duration("PROXY_LOADING_COMMENT_INTERVAL", default.loading_comment_interval),
        upstream_connect_timeout=read.duration("PROXY_UPSTREAM_CONNECT_TIMEOUT", default.upstream_connect_timeout),
        upstream_max_connections=read.integer("PROXY_UPSTREAM_MAX_CONNECTIONS", default.upstream_max_connections),
    )
