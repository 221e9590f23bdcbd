"""Tracing settings, parsed from the environment snapshot that ``flexinfer.settings.environment()`` returns.

Called by the composition roots (``flexinfer.assembly``) before ``init_tracing``. Nothing here reads
the process environment: every standard ``OTEL_*`` variable the exporter, resource and sampler need is parsed from the
snapshot and later passed to the SDK explicitly. Parsing goes through ``flexinfer.core.envvalues.EnvReader``:
``FLEXINFER_OTEL_TRUST_INCOMING`` guards trust of incoming headers, so an unparsable value is a
``ConfigError`` (fail closed); the other unparsable values keep their default (the Go and OpenTelemetry rule)
and are logged as warnings naming the variable. Values that only matter when tracing is on (endpoint URL,
sampler name and ratio, protocol, TLS files) are checked by ``init_tracing``, and only then.

Variables: ``FLEXINFER_OTEL_ENABLED`` (bool words, default off; ``OTEL_SDK_DISABLED=true`` also turns it off),
``FLEXINFER_OTEL_SERVICE_NAMESPACE``, ``FLEXINFER_OTEL_TRUST_INCOMING`` (default on), ``OTEL_SERVICE_NAME``,
``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_TRACES_SAMPLER``/``_ARG``, ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``,
``_HEADERS``, ``_TIMEOUT`` (milliseconds, as the OpenTelemetry specification says), ``_COMPRESSION``,
``_CERTIFICATE``, ``_CLIENT_KEY``, ``_CLIENT_CERTIFICATE``, ``OTEL_EXPORTER_OTLP_PROTOCOL``, ``OTEL_BSP_*``.

Why not the SDK's own ``OTEL_*`` handling: the exporter, batch processor, resource detector and sampler read
the process environment at construction (not a snapshot), and their bad-value behaviour differs per class: an
unparsable ``OTEL_BSP_*`` logs a traceback and keeps the default, an unknown ``OTEL_TRACES_SAMPLER`` becomes
``parentbased_always_on`` (FlexInfer refuses to start: a sampling choice is not guessed). Here every value is
parsed once, with the FlexInfer policy, and passed to the SDK explicitly (which also keeps tracing free of
process globals).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from flexinfer import settings as process_settings
from flexinfer.core.envvalues import EnvReader, EnvVar, Kind, Policy, Warn

ENABLED = "FLEXINFER_OTEL_ENABLED"
SERVICE_NAMESPACE = "FLEXINFER_OTEL_SERVICE_NAMESPACE"
TRUST_INCOMING = "FLEXINFER_OTEL_TRUST_INCOMING"
DEFAULT_ENDPOINT = "http://localhost:4318"
TRACES_PATH = "v1/traces"
DEFAULT_TIMEOUT_SECONDS = 10.0
DEFAULT_SAMPLER = "parentbased_always_on"
_OTLP = "OTEL_EXPORTER_OTLP_"
_OTLP_TRACES = "OTEL_EXPORTER_OTLP_TRACES_"

FALLBACK, WHEN_ENABLED = Policy.FALLBACK, Policy.WHEN_ENABLED
COMPRESSIONS = ("none", "gzip", "deflate")
ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(ENABLED, "false", "Turn OpenTelemetry tracing on (1/true/yes/on); off = no exporter, nothing touched.",
           Kind.BOOL, FALLBACK),
    EnvVar(SERVICE_NAMESPACE, "", "`service.namespace` resource attribute."),
    EnvVar(TRUST_INCOMING, "true", "Continue traces from clients' `traceparent`; set false on public-facing proxies.",
           Kind.BOOL, Policy.GUARD),
    EnvVar("OTEL_EXPORTER_OTLP_ENDPOINT", DEFAULT_ENDPOINT,
           "OTLP/HTTP collector base URL (`/v1/traces` is appended); `..._TRACES_ENDPOINT` is used as is.",
           Kind.URL, WHEN_ENABLED),
    EnvVar("OTEL_EXPORTER_OTLP_HEADERS", "", "Extra export headers, `k1=v1,k2=v2` (also `..._TRACES_HEADERS`).",
           Kind.PAIRS, FALLBACK),
    EnvVar("OTEL_EXPORTER_OTLP_TIMEOUT", "10000", "Export timeout in milliseconds.", Kind.MILLIS, FALLBACK),
    EnvVar("OTEL_EXPORTER_OTLP_COMPRESSION", "", "`gzip` or `deflate` for exported batches.", Kind.CHOICE, FALLBACK),
    EnvVar("OTEL_SERVICE_NAME", "", "Overrides the service name each command passes (e.g. flexinfer-proxy)."),
    EnvVar("OTEL_RESOURCE_ATTRIBUTES", "", "Extra resource attributes, `k1=v1,k2=v2`.", Kind.PAIRS, FALLBACK),
    EnvVar("OTEL_TRACES_SAMPLER", DEFAULT_SAMPLER, "Standard sampler name, e.g. parentbased_traceidratio.",
           Kind.CHOICE, WHEN_ENABLED),
    EnvVar("OTEL_TRACES_SAMPLER_ARG", "", "Sampler argument: the ratio (0 to 1) of the *traceidratio samplers.",
           Kind.NUMBER, WHEN_ENABLED),
    EnvVar("OTEL_BSP_SCHEDULE_DELAY", "5000", "Batch span processor: milliseconds between exports.",
           Kind.INT, FALLBACK),
    EnvVar("OTEL_BSP_EXPORT_TIMEOUT", "30000", "Batch span processor: export timeout in milliseconds.",
           Kind.INT, FALLBACK),
    EnvVar("OTEL_BSP_MAX_QUEUE_SIZE", "2048", "Batch span processor: spans buffered before dropping.",
           Kind.INT, FALLBACK),
    EnvVar("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "512", "Batch span processor: spans per export.", Kind.INT, FALLBACK),
    EnvVar("OTEL_SDK_DISABLED", "false", "`true` forces tracing off whatever FLEXINFER_OTEL_ENABLED says.",
           Kind.BOOL, FALLBACK),
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


def tracing_settings(env: Mapping[str, str], warn: Warn | None = process_settings.warn) -> TracingSettings:
    """Parse the tracing part of an environment snapshot. Raises ``ConfigError`` only for an unparsable
    ``FLEXINFER_OTEL_TRUST_INCOMING``; other unparsable values keep their default and go to ``warn``."""
    read = EnvReader(env, warn)
    enabled, sdk_disabled = read.flag(ENABLED, False, FALLBACK), read.flag("OTEL_SDK_DISABLED", False, FALLBACK)
    return TracingSettings(
        enabled=enabled and not sdk_disabled,
        service_namespace=read.text(SERVICE_NAMESPACE),
        trust_incoming=read.flag(TRUST_INCOMING, True, Policy.GUARD),
        service_name=read.text("OTEL_SERVICE_NAME"),
        resource_attributes=key_value_list(read, "OTEL_RESOURCE_ATTRIBUTES"),
        sampler=read.text("OTEL_TRACES_SAMPLER").lower() or DEFAULT_SAMPLER,
        sampler_arg=read.text("OTEL_TRACES_SAMPLER_ARG"),
        exporter=exporter_settings(read),
        batch=batch_settings(read),
    )


def exporter_settings(read: EnvReader) -> ExporterSettings:
    """Resolve the OTLP exporter variables: ``OTEL_EXPORTER_OTLP_TRACES_X`` wins over ``OTEL_EXPORTER_OTLP_X``."""
    timeout = read.number(_otlp(read, "TIMEOUT"), DEFAULT_TIMEOUT_SECONDS * 1000, FALLBACK)
    if timeout <= 0:
        timeout = read.invalid(_otlp(read, "TIMEOUT"), read.raw(_otlp(read, "TIMEOUT")), "not a positive number",
                               DEFAULT_TIMEOUT_SECONDS * 1000, FALLBACK)
    return ExporterSettings(
        endpoint=traces_endpoint(read),
        headers=key_value_list(read, _otlp(read, "HEADERS")),
        timeout_seconds=timeout / 1000.0,
        compression=read.choice(_otlp(read, "COMPRESSION"), COMPRESSIONS, "none", FALLBACK),
        protocol=read.text(_otlp(read, "PROTOCOL")).lower() or "http/protobuf",
        certificate=read.text(_otlp(read, "CERTIFICATE")) or None,
        client_key=read.text(_otlp(read, "CLIENT_KEY")) or None,
        client_certificate=read.text(_otlp(read, "CLIENT_CERTIFICATE")) or None,
    )


def traces_endpoint(read: EnvReader) -> str:
    """The traces URL: the per-signal endpoint as given, else the base endpoint plus ``/v1/traces``."""
    signal = read.text(f"{_OTLP_TRACES}ENDPOINT")
    if signal:
        return signal
    base = read.text(f"{_OTLP}ENDPOINT", DEFAULT_ENDPOINT)
    return f"{base.rstrip('/')}/{TRACES_PATH}"


def batch_settings(read: EnvReader) -> BatchSettings:
    """``OTEL_BSP_*`` as positive integers; anything else keeps the default (with a warning)."""
    default = BatchSettings()
    return BatchSettings(
        schedule_delay_millis=read.integer("OTEL_BSP_SCHEDULE_DELAY", default.schedule_delay_millis, FALLBACK, 1),
        export_timeout_millis=read.integer("OTEL_BSP_EXPORT_TIMEOUT", default.export_timeout_millis, FALLBACK, 1),
        max_queue_size=read.integer("OTEL_BSP_MAX_QUEUE_SIZE", default.max_queue_size, FALLBACK, 1),
        max_export_batch_size=read.integer("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", default.max_export_batch_size,
                                           FALLBACK, 1),
    )


def key_value_list(read: EnvReader, name: str) -> dict[str, str]:
    """The W3C-baggage-like ``k1=v1,k2=v2`` format of ``OTEL_RESOURCE_ATTRIBUTES`` and ``..._HEADERS``.

    Values are percent-decoded; an entry without ``=`` or with an empty key is skipped with a warning.
    """
    pairs: dict[str, str] = {}
    for entry in read.raw(name).split(","):
        if not entry.strip():
            continue
        key, sep, value = entry.partition("=")
        if sep and key.strip():
            pairs[unquote(key.strip())] = unquote(value.strip())
        else:
            read.invalid(name, entry.strip(), "not a key=value entry", None, FALLBACK, shown="entry skipped")
    return pairs


def _otlp(read: EnvReader, suffix: str) -> str:
    """The name of the variable in effect: ``OTEL_EXPORTER_OTLP_TRACES_<suffix>`` when set, else the generic one."""
    signal = f"{_OTLP_TRACES}{suffix}"
    return signal if read.raw(signal) else f"{_OTLP}{suffix}"
