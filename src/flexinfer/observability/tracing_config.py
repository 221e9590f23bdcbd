"""Tracing settings, parsed from the environment snapshot that ``flexinfer.settings.environment()`` returns.

Called by the composition roots (``flexinfer.assembly``) before ``init_tracing``. Nothing here reads
``os.environ``: every standard ``OTEL_*`` variable the exporter, resource and sampler need is parsed from the
snapshot and later passed to the SDK explicitly. Parsing never fails, whatever the text; values that can only
be judged when tracing is on (endpoint URL, sampler name, protocol) are checked by ``init_tracing``.

Variables: ``FLEXINFER_OTEL_ENABLED`` (bool words, default off; ``OTEL_SDK_DISABLED=true`` also turns it off),
``FLEXINFER_OTEL_SERVICE_NAMESPACE``, ``FLEXINFER_OTEL_TRUST_INCOMING`` (default on), ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``/``_ARG``, ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``,
``_HEADERS``, ``_TIMEOUT`` (milliseconds, as the OpenTelemetry specification says), ``_COMPRESSION``,
``_CERTIFICATE``, ``_CLIENT_KEY``, ``_CLIENT_CERTIFICATE``, ``OTEL_EXPORTER_OTLP_PROTOCOL``, ``OTEL_BSP_*``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from flexinfer.core.envvalues import EnvVar, bool_word, positive_int

ENABLED = "FLEXINFER_OTEL_ENABLED"
SERVICE_NAMESPACE = "FLEXINFER_OTEL_SERVICE_NAMESPACE"
TRUST_INCOMING = "FLEXINFER_OTEL_TRUST_INCOMING"
DEFAULT_ENDPOINT = "http://localhost:4318"
TRACES_PATH = "v1/traces"
DEFAULT_TIMEOUT_SECONDS = 10.0
DEFAULT_SAMPLER = "parentbased_always_on"
_OTLP = "OTEL_EXPORTER_OTLP_"
_OTLP_TRACES = "OTEL_EXPORTER_OTLP_TRACES_"

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(ENABLED, "false", "Turn OpenTelemetry tracing on (1/true/yes/on); off = no exporter, nothing touched."),
    EnvVar(SERVICE_NAMESPACE, "", "`service.namespace` resource attribute."),
    EnvVar(TRUST_INCOMING, "true", "Continue traces from clients' `traceparent`; set false on public-facing proxies."),
    EnvVar("OTEL_EXPORTER_OTLP_ENDPOINT", DEFAULT_ENDPOINT,
           "OTLP/HTTP collector base URL (`/v1/traces` is appended); `..._TRACES_ENDPOINT` is used as is."),
    EnvVar("OTEL_EXPORTER_OTLP_HEADERS", "", "Extra export headers, `k1=v1,k2=v2` (also `..._TRACES_HEADERS`)."),
    EnvVar("OTEL_EXPORTER_OTLP_TIMEOUT", "10000", "Export timeout in milliseconds."),
    EnvVar("OTEL_EXPORTER_OTLP_COMPRESSION", "", "`gzip` or `deflate` for exported batches."),
    EnvVar("OTEL_SERVICE_NAME", "", "Overrides the service name each command passes (e.g. flexinfer-proxy)."),
    EnvVar("OTEL_RESOURCE_ATTRIBUTES", "", "Extra resource attributes, `k1=v1,k2=v2`."),
    EnvVar("OTEL_TRACES_SAMPLER", DEFAULT_SAMPLER, "Standard sampler name, e.g. parentbased_traceidratio."),
    EnvVar("OTEL_TRACES_SAMPLER_ARG", "", "Sampler argument (the ratio for the *traceidratio samplers)."),
    EnvVar("OTEL_BSP_SCHEDULE_DELAY", "5000", "Batch span processor: milliseconds between exports."),
    EnvVar("OTEL_BSP_EXPORT_TIMEOUT", "30000", "Batch span processor: export timeout in milliseconds."),
    EnvVar("OTEL_BSP_MAX_QUEUE_SIZE", "2048", "Batch span processor: spans buffered before dropping."),
    EnvVar("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512", "Batch span processor: spans per export."),
    EnvVar("OTEL_SDK_DISABLED", "false", "`true` forces tracing off whatever FLEXINFER_OTEL_ENABLED says."),
)


@dataclass(frozen=True)
class ExporterSettings:
    """OTLP/HTTP exporter options, already resolved (per-signal variable over the generic one)."""

    endpoint: str = f"{DEFAULT_ENDPOINT}/{TRACES_PATH}"
    """Full URL spans are POSTed to (``.../v1/traces``)."""
    headers: Mapping[str, str] = field(default_factory=dict)
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    compression: str = "none"
    """``none``, ``gzip`` or ``deflate``; any other word falls back to ``none``."""
    protocol: str = "http/protobuf"
    certificate: str | None = None
    client_key: str | None = None
    client_certificate: str | None = None


@dataclass(frozen=True)
class BatchSettings:
    """Batch span processor tuning (``OTEL_BSP_*``), defaults as the OpenTelemetry specification."""

    schedule_delay_millis: int = 5000
    export_timeout_millis: int = 30000
    max_queue_size: int = 2048
    max_export_batch_size: int = 512


@dataclass(frozen=True)
class TracingSettings:
    """Everything ``init_tracing`` needs. The default value is "tracing off"."""

    enabled: bool = False
    service_namespace: str = ""
    trust_incoming: bool = True
    """Continue traces from incoming ``traceparent``/``baggage`` headers; turn off on public-facing proxies."""
    service_name: str = ""
    """``OTEL_SERVICE_NAME``: when set it replaces the name the process passes to ``init_tracing``."""
    resource_attributes: Mapping[str, str] = field(default_factory=dict)
    sampler: str = DEFAULT_SAMPLER
    sampler_arg: str = ""
    exporter: ExporterSettings = field(default_factory=ExporterSettings)
    batch: BatchSettings = field(default_factory=BatchSettings)


def tracing_settings(env: Mapping[str, str]) -> TracingSettings:
    """Parse the tracing part of an environment snapshot. Never raises."""
    return TracingSettings(
        enabled=bool_word(env.get(ENABLED), False) and not bool_word(env.get("OTEL_SDK_DISABLED"), False),
        service_namespace=env.get(SERVICE_NAMESPACE, "").strip(),
        trust_incoming=bool_word(env.get(TRUST_INCOMING), True),
        service_name=env.get("OTEL_SERVICE_NAME", "").strip(),
        resource_attributes=key_value_list(env.get("OTEL_RESOURCE_ATTRIBUTES", "")),
        sampler=env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or DEFAULT_SAMPLER,
        sampler_arg=env.get("OTEL_TRACES_SAMPLER_ARG", "").strip(),
        exporter=exporter_settings(env),
        batch=batch_settings(env),
    )


def exporter_settings(env: Mapping[str, str]) -> ExporterSettings:
    """Resolve the OTLP exporter variables: ``OTEL_EXPORTER_OTLP_TRACES_X`` wins over ``OTEL_EXPORTER_OTLP_X``."""
    compression = _otlp(env, "COMPRESSION").lower()
    return ExporterSettings(
        endpoint=traces_endpoint(env),
        headers=key_value_list(_otlp(env, "HEADERS")),
        timeout_seconds=_timeout_seconds(_otlp(env, "TIMEOUT")),
        compression=compression if compression in {"gzip", "deflate"} else "none",
        protocol=_otlp(env, "PROTOCOL").lower() or "http/protobuf",
        certificate=_otlp(env, "CERTIFICATE") or None,
        client_key=_otlp(env, "CLIENT_KEY") or None,
        client_certificate=_otlp(env, "CLIENT_CERTIFICATE") or None,
    )


def traces_endpoint(env: Mapping[str, str]) -> str:
    """The traces URL: the per-signal endpoint as given, else the base endpoint plus ``/v1/traces``."""
    signal = env.get(f"{_OTLP_TRACES}ENDPOINT", "").strip()
    if signal:
        return signal
    base = env.get(f"{_OTLP}ENDPOINT", "").strip() or DEFAULT_ENDPOINT
    return f"{base.rstrip('/')}/{TRACES_PATH}"


def batch_settings(env: Mapping[str, str]) -> BatchSettings:
    """``OTEL_BSP_*`` as positive integers; anything else keeps the default."""
    default = BatchSettings()
    return BatchSettings(
        schedule_delay_millis=positive_int(env.get("OTEL_BSP_SCHEDULE_DELAY"), default.schedule_delay_millis),
        export_timeout_millis=positive_int(env.get("OTEL_BSP_EXPORT_TIMEOUT"), default.export_timeout_millis),
        max_queue_size=positive_int(env.get("OTEL_BSP_MAX_QUEUE_SIZE"), default.max_queue_size),
        max_export_batch_size=positive_int(env.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE"), default.max_export_batch_size),
    )


def key_value_list(text: str) -> dict[str, str]:
    """The W3C-baggage-like ``k1=v1,k2=v2`` format of ``OTEL_RESOURCE_ATTRIBUTES`` and ``..._HEADERS``.

    Values are percent-decoded; entries without ``=`` or with an empty key are skipped.
    """
    pairs: dict[str, str] = {}
    for entry in text.split(","):
        key, sep, value = entry.partition("=")
        if sep and key.strip():
            pairs[unquote(key.strip())] = unquote(value.strip())
    return pairs


def _otlp(env: Mapping[str, str], suffix: str) -> str:
    return (env.get(f"{_OTLP_TRACES}{suffix}", "").strip() or env.get(f"{_OTLP}{suffix}", "")).strip()


def _timeout_seconds(millis: str) -> float:
    """``OTEL_EXPORTER_OTLP_TIMEOUT`` is in milliseconds; non-numbers and values ≤ 0 keep the default."""
    try:
        value = float(millis)
    except ValueError:
        return DEFAULT_TIMEOUT_SECONDS
    return value / 1000.0 if math.isfinite(value) and value > 0 else DEFAULT_TIMEOUT_SECONDS
