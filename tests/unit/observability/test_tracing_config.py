"""Tracing settings: the bool words, the standard OTEL_* variables, warnings for unparsable values, and the
trust setting that fails closed."""

from __future__ import annotations

import pytest

from flexinfer.core.envvalues import EnvReader
from flexinfer.core.errors import ConfigError
from flexinfer.observability.tracing.config import ExporterSettings, TracingSettings, key_value_list, tracing_settings


@pytest.mark.parametrize(
    ("word", "enabled"),
    [
        ("1", True), ("true", True), ("yes", True), ("on", True), ("TRUE", True), (" on ", True), ("Yes", True),
        ("0", False), ("false", False), ("no", False), ("off", False), ("", False),
    ],
)
def test_enabled_accepts_the_bool_words_and_defaults_off(word: str, enabled: bool) -> None:
    assert tracing_settings({"FLEXINFER_OTEL_ENABLED": word}).enabled is enabled


@pytest.mark.parametrize(("word", "trusted"), [("", True), ("false", False), (" OFF ", False),
                                               ("0", False), ("yes", True)])
def test_trust_incoming_defaults_on(word: str, trusted: bool) -> None:
    assert tracing_settings({"FLEXINFER_OTEL_TRUST_INCOMING": word}).trust_incoming is trusted


@pytest.mark.parametrize("word", ["maybe", "flase", "2"])
def test_unparsable_trust_incoming_fails_closed(word: str) -> None:
    with pytest.raises(ConfigError, match="FLEXINFER_OTEL_TRUST_INCOMING"):
        tracing_settings({"FLEXINFER_OTEL_TRUST_INCOMING": word})


def test_unparsable_enabled_stays_off_with_a_warning() -> None:
    warnings: list[str] = []
    assert tracing_settings({"FLEXINFER_OTEL_ENABLED": "maybe"}, warnings.append).enabled is False
    assert warnings == ["FLEXINFER_OTEL_ENABLED='maybe' is not a boolean (use 1/true/yes/on or 0/false/no/off); "
                        "using the default False"]


def test_empty_environment_is_tracing_off_with_spec_defaults() -> None:
    settings = tracing_settings({})
    assert settings == TracingSettings()
    assert settings.exporter == ExporterSettings(endpoint="http://localhost:4318/v1/traces")
    assert settings.sampler == "parentbased_always_on"


def test_otel_sdk_disabled_wins_over_enabled() -> None:
    env = {"FLEXINFER_OTEL_ENABLED": "true", "OTEL_SDK_DISABLED": "true"}
    assert tracing_settings(env).enabled is False


def test_service_namespace_is_trimmed() -> None:
    assert tracing_settings({"FLEXINFER_OTEL_SERVICE_NAMESPACE": "  flexinfer-system "}).service_namespace == (
        "flexinfer-system"
    )


@pytest.mark.parametrize(
    ("env", "endpoint"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "http://collector:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, "http://collector:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/base"}, "http://c:4318/base/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:1", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:2/custom"},
         "http://b:2/custom"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "  "}, "http://localhost:4318/v1/traces"),
    ],
)
def test_traces_endpoint_resolution(env: dict[str, str], endpoint: str) -> None:
    assert tracing_settings(env).exporter.endpoint == endpoint


def test_exporter_options_per_signal_variables_win() -> None:
    exporter = tracing_settings({
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20abc,x-team=ml",
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "x-only=traces",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "GZIP",
    }).exporter
    assert exporter.headers == {"x-only": "traces"}
    assert exporter.timeout_seconds == 2.5
    assert exporter.compression == "gzip"


@pytest.mark.parametrize(("text", "seconds"), [("abc", 10.0), ("-5", 10.0), ("0", 10.0), ("nan", 10.0),
                                               ("inf", 10.0), ("500", 0.5)])
def test_timeout_is_milliseconds_and_garbage_keeps_default(text: str, seconds: float) -> None:
    warnings: list[str] = []
    assert tracing_settings({"OTEL_EXPORTER_OTLP_TIMEOUT": text}, warnings.append).exporter.timeout_seconds == seconds
    assert all("OTEL_EXPORTER_OTLP_TIMEOUT" in w for w in warnings) and (len(warnings) == 1) is (text != "500")


def test_unknown_compression_falls_back_to_none() -> None:
    warnings: list[str] = []
    settings = tracing_settings({"OTEL_EXPORTER_OTLP_COMPRESSION": "brotli"}, warnings.append)
    assert settings.exporter.compression == "none"
    assert len(warnings) == 1 and "OTEL_EXPORTER_OTLP_COMPRESSION='brotli'" in warnings[0]


def test_key_value_list_decodes_and_skips_malformed_entries_with_warnings() -> None:
    warnings: list[str] = []
    read = EnvReader({"X": "a=1, b = two%2Cthree ,junk,=x,c="}, warnings.append)
    assert key_value_list(read, "X") == {"a": "1", "b": "two,three", "c": ""}
    assert [w.split(" is ")[0] for w in warnings] == ["X='junk'", "X='=x'"]


def test_resource_and_sampler_variables_are_kept() -> None:
    settings = tracing_settings({
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=prod,k8s.cluster.name=lab",
        "OTEL_SERVICE_NAME": "edge", "OTEL_TRACES_SAMPLER": "TraceIdRatio", "OTEL_TRACES_SAMPLER_ARG": "0.25",
    })
    assert settings.resource_attributes == {"deployment.environment": "prod", "k8s.cluster.name": "lab"}
    assert (settings.service_name, settings.sampler, settings.sampler_arg) == ("edge", "traceidratio", "0.25")


def test_garbage_everywhere_never_raises_and_warns_by_name() -> None:
    garbage = "::not a url:: \x00 %%% ,,=="
    env = {name: garbage for name in (
        "FLEXINFER_OTEL_ENABLED", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_HEADERS",
        "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_RESOURCE_ATTRIBUTES",
        "OTEL_TRACES_SAMPLER", "OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_MAX_QUEUE_SIZE",
    )}
    warnings: list[str] = []
    settings = tracing_settings(env, warnings.append)
    assert settings.enabled is False
    assert settings.batch.max_queue_size == 2048
    warned = {w.split("=")[0] for w in warnings}
    assert {"FLEXINFER_OTEL_ENABLED", "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TIMEOUT",
            "OTEL_EXPORTER_OTLP_COMPRESSION", "OTEL_RESOURCE_ATTRIBUTES", "OTEL_BSP_SCHEDULE_DELAY",
            "OTEL_BSP_MAX_QUEUE_SIZE"} <= warned
