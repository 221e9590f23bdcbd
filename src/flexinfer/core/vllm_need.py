"""A vLLM server's memory need, estimated before it ever ran: what vLLM itself reserves, not what its weights weigh.

On a GPU, vLLM does not size its memory from the weights: at start it reserves ``--gpu-memory-utilization``
(``U``; default 0.9) of the device's *total* memory for the whole instance (weights, activations, CUDA graphs
and a KV cache that fills whatever is left), on every GPU it uses, and refuses to start when that much is not
free. A vLLM member on a GPU therefore needs ``U`` times the memory of its GPU(s), whatever the size of its weights.
With the default ``U`` it takes nearly the whole card and cannot share it: give it the share it may have with
``--gpu-memory-utilization`` in ``spec.config.args``.

On the CPU (a model without a GPU), vLLM keeps the weights in host memory and a KV cache of
``VLLM_CPU_KVCACHE_SPACE`` GiB (``spec.config.env`` first, then the environment the server inherits): the need
is the weights' size plus that space. ``DEFAULT_CPU_KV_GIB`` (4 GiB, the default vLLM documents) applies when the
variable is unset, empty or 0; newer vLLM releases may size the cache differently when it is unset, so set the
variable for an exact figure.

``need_mib`` is pure: the caller gives the memory of the GPU(s) (the local engine's GPU discovery; the manager's
GPU profile) and the weights' size (only the local engine can read the files). ``None`` when it cannot say;
``ConfigError`` naming the field for a ``--gpu-memory-utilization`` or ``VLLM_CPU_KVCACHE_SPACE`` vLLM would
refuse. Used by ``flexinfer.local.memory_estimate`` and ``flexinfer.core.active_set.need_of``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

from flexinfer.api.model import Model
from flexinfer.core.errors import ConfigError
from flexinfer.core.memory_need import MIB
from flexinfer.core.profiles import config_args, flag_value

BACKENDS: Final = ("vllm",)
"""Backends this rule covers. ``vllm-omni`` is left out: its pipelines run several stages, each with its own
memory share from its stage configuration, so one ``--gpu-memory-utilization`` does not describe it."""
UTILIZATION_FLAG: Final = "--gpu-memory-utilization"
DEFAULT_UTILIZATION: Final = 0.9
"""vLLM's default ``gpu_memory_utilization`` (``CacheConfig``)."""
KV_SPACE_VARIABLE: Final = "VLLM_CPU_KVCACHE_SPACE"
DEFAULT_CPU_KV_GIB: Final = 4.0
GIB_MIB: Final = 1024.0


def covers(model: Model) -> bool:
    """A model this rule estimates: a vLLM backend run by its own server (not a custom ``spec.config.command``)."""
    return model.backend in BACKENDS and model.spec.config.get("command") is None


def need_mib(model: Model, *, device_mib: float | None, weights_bytes: int | None,
             inherited_env: Mapping[str, str] | None = None) -> float | None:
    """The model's estimated need in MiB (see the module docstring). ``device_mib``: the total memory of the GPU(s)
    it runs on, counted as its group's budget counts them (``None``: unknown); ``weights_bytes``: the size of its
    weights (``None``: unknown); ``inherited_env``: the environment its server inherits (under
    ``spec.config.env``). ``None`` for other backends, and when the figure it needs is unknown."""
    if not covers(model):
        return None
    if model.gpu_count > 0:
        return utilization(model) * device_mib if device_mib is not None and device_mib > 0 else None
    if weights_bytes is None:
        return None
    return weights_bytes / MIB + cpu_kv_gib(model, inherited_env or {}) * GIB_MIB


def utilization(model: Model) -> float:
    """``--gpu-memory-utilization`` of ``spec.config.args`` (``--flag V`` or ``--flag=V``; the last one wins),
    else ``DEFAULT_UTILIZATION``; ``ConfigError`` naming the flag for a value outside (0, 1]."""
    text = flag_value(config_args(model), (UTILIZATION_FLAG,))
    if text is None:
        return DEFAULT_UTILIZATION
    value = _number(text)
    if value is None or not 0.0 < value <= 1.0:
        raise ConfigError(f"{model.key}: spec.config.args: {UTILIZATION_FLAG} must be a fraction in (0, 1], "
                          f"got {text!r}")
    return value


def cpu_kv_gib(model: Model, inherited_env: Mapping[str, str]) -> float:
    """``VLLM_CPU_KVCACHE_SPACE`` in GiB from ``spec.config.env``, else ``inherited_env``; ``DEFAULT_CPU_KV_GIB``
    when unset, empty or 0; ``ConfigError`` naming the variable for anything but a number >= 0."""
    env = model.spec.config.get("env")
    own = env.get(KV_SPACE_VARIABLE) if isinstance(env, dict) else None
    text = str(own) if own is not None else inherited_env.get(KV_SPACE_VARIABLE)
    if text is None or not text.strip():
        return DEFAULT_CPU_KV_GIB
    value = _number(text.strip())
    if value is None or value < 0:
        where = "spec.config.env" if own is not None else "the environment"
        raise ConfigError(f"{model.key}: {where}: {KV_SPACE_VARIABLE} must be a number of GiB, got {text!r}")
    return value or DEFAULT_CPU_KV_GIB


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None
