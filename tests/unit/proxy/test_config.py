"""PROXY_* environment parsing, defaults, validation messages, and the documentation table."""

from __future__ import annotations

import dataclasses

import pytest

from flexinfer.core.errors import ConfigError
from flexinfer.proxy.config import ENV_VARS, ProxyConfig, proxy_config


def test_defaults_match_the_spec():
    config = proxy_config({})
    assert config == ProxyConfig()
    assert (config.max_queue_size, config.queue_timeout, config.cold_start_timeout) == (100, 60.0, 60.0)
    assert (config.graceful_shutdown_timeout, config.shutdown_drain_delay) == (600.0, 5.0)
    assert (config.rate_limit_per_model, config.rate_limit_burst) == (100.0, 50)
    assert (config.rate_limit_global, config.rate_limit_global_burst) == (1000.0, 200)
    assert config.max_concurrency_per_model == 0 and not config.auth_enabled
    assert config.stall_timeout == 120.0
    config.validate()


def test_values_are_parsed():
    config = proxy_config({
        "PROXY_MAX_QUEUE_SIZE": "7", "PROXY_QUEUE_TIMEOUT": "2m", "PROXY_COLD_START_TIMEOUT": "1h30m",
        "PROXY_AUTH_ENABLED": "Yes", "PROXY_AUTH_TOKEN": " tok ", "PROXY_MAX_BODY_BYTES": "1Mi",
        "PROXY_MAX_CONCURRENCY_PER_MODEL": "4", "PROXY_RATE_LIMIT_PER_MODEL": "2.5", "PROXY_STALL_TIMEOUT": "20s",
    })
    assert (config.max_queue_size, config.queue_timeout, config.cold_start_timeout) == (7, 120.0, 5400.0)
    assert config.auth_enabled and config.auth_token == "tok"
    assert config.max_body_bytes == 1024 * 1024 and config.max_concurrency_per_model == 4
    assert config.rate_limit_per_model == 2.5 and config.stall_timeout == 20.0
    assert config.wait_timeout == 5400.0


@pytest.mark.parametrize("name,value", [
    ("PROXY_MAX_QUEUE_SIZE", "many"), ("PROXY_QUEUE_TIMEOUT", "soon"), ("PROXY_MAX_BODY_BYTES", "big"),
    ("PROXY_RATE_LIMIT_GLOBAL", "x"),
])
def test_malformed_values_name_the_variable(name, value):
    with pytest.raises(ConfigError, match=name):
        proxy_config({name: value})


@pytest.mark.parametrize("env,name", [
    ({"PROXY_MAX_QUEUE_SIZE": "0"}, "PROXY_MAX_QUEUE_SIZE"),
    ({"PROXY_QUEUE_TIMEOUT": "0"}, "PROXY_QUEUE_TIMEOUT"),
    ({"PROXY_COLD_START_TIMEOUT": "0s"}, "PROXY_COLD_START_TIMEOUT"),
    ({"PROXY_STALL_TIMEOUT": "0s"}, "PROXY_STALL_TIMEOUT"),
    ({"PROXY_AUTH_ENABLED": "true"}, "PROXY_AUTH_TOKEN"),
    ({"PROXY_RATE_LIMIT_ENABLED": "on", "PROXY_RATE_LIMIT_BURST": "-1"}, "PROXY_RATE_LIMIT_BURST"),
    ({"PROXY_RATE_LIMIT_ENABLED": "on", "PROXY_RATE_LIMIT_GLOBAL": "-5"}, "PROXY_RATE_LIMIT_GLOBAL"),
    ({"PROXY_MAX_CONCURRENCY_PER_MODEL": "-1"}, "PROXY_MAX_CONCURRENCY_PER_MODEL"),
])
def test_validate_rejects_with_the_variable_name(env, name):
    with pytest.raises(ConfigError, match=name):
        proxy_config(env).validate()


def test_rate_limit_values_only_checked_when_enabled():
    proxy_config({"PROXY_RATE_LIMIT_BURST": "0"}).validate()


def test_negative_shutdown_durations_rejected():
    with pytest.raises(ConfigError, match="PROXY_SHUTDOWN_DRAIN_DELAY"):
        ProxyConfig(shutdown_drain_delay=-1).validate()
    with pytest.raises(ConfigError, match="PROXY_GRACEFUL_SHUTDOWN_TIMEOUT"):
        ProxyConfig(graceful_shutdown_timeout=-1).validate()


def test_env_table_documents_every_field_and_defaults_agree():
    assert len(ENV_VARS) == len(dataclasses.fields(ProxyConfig))
    assert all(var.name.startswith("PROXY_") and var.description for var in ENV_VARS)
    assert proxy_config({var.name: var.default for var in ENV_VARS}) == ProxyConfig()
