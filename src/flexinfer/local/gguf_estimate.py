"""A llama.cpp model's memory need, estimated from its GGUF header before it ever ran.

``estimate_mib(model, base_dir)`` reads the header of the model's ``file://`` GGUF (the ``gguf`` package's
reader maps the file and parses the metadata and tensor table; the weights themselves are not read) and
the server settings its manifest gives (``spec.config.args``: ``--ctx-size``/``-c``, ``--n_ctx`` for
llama-cpp-python's server, ``--ubatch-size``/``-ub``, ``--cache-type-k``/``-ctk``,
``--cache-type-v``/``-ctv``, ``--kv-unified``/``-kvu``; the parallel slots as the launch profile passes
them), and computes the need with ``flexinfer.core.memory_need.llama_mib``. A split GGUF
(``name-00001-of-00003.gguf``) counts the tensors of every part. ``None`` when the model is not a llama.cpp
GGUF on this machine; ``EstimateError`` when the file cannot be read as one, or the ``gguf`` package (the
``flexinfer[gguf]`` extra) is missing (the caller logs it and the model's need stays unknown).

Blocking file I/O: called off the event loop by the dispatcher, through ``flexinfer.local.memory_estimate``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flexinfer.api.model import Model
from flexinfer.core.errors import ConfigError, EngineError, FlexInferError
from flexinfer.core.memory_need import LlamaRun, LlamaShape, llama_mib
from flexinfer.core.profiles import config_args, flag_value, parallel_requests
from flexinfer.local.sources import existing_source

_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<parts>\d{5})\.gguf$")
_CONTEXT_FLAGS = ("--ctx-size", "-c", "--n_ctx")
_UBATCH_FLAGS = ("--ubatch-size", "-ub")
_K_TYPE_FLAGS = ("--cache-type-k", "-ctk")
_V_TYPE_FLAGS = ("--cache-type-v", "-ctv")
_UNIFIED_FLAGS = ("--kv-unified", "-kvu")


class EstimateError(FlexInferError):
    """The weights could not be read as a GGUF (the message names the file and why)."""


def estimate_mib(model: Model, base_dir: Path) -> float | None:
    """The model's estimated need in MiB, or ``None`` when it is not a llama.cpp GGUF on this machine."""
    if model.backend != "llamacpp" or model.spec.config.get("command") is not None:
        return None
    try:
        path = existing_source(model, base_dir)
    except EngineError:
        return None
    if path.is_dir():
        files = sorted(path.glob("*.gguf"))
        if not files:
            return None
        path = files[0]
    elif path.suffix != ".gguf":
        return None
    try:
        run = run_settings(model)
    except ConfigError as exc:
        raise EstimateError(str(exc)) from None
    return llama_mib(read_shape(path), run)


def read_shape(path: Path) -> LlamaShape:
    """What ``path``'s GGUF header says about the model's memory (``EstimateError`` when it cannot say)."""
    reader = _reader(path)
    arch = _field(reader, "general.architecture", path)
    if not isinstance(arch, str):
        raise EstimateError(f"{path}: general.architecture is not a string")
    layers = _int(reader, f"{arch}.block_count", path)
    embedding = _int(reader, f"{arch}.embedding_length", path)
    heads = _per_layer(_field(reader, f"{arch}.attention.head_count", path), layers)
    kv = _optional(reader, f"{arch}.attention.head_count_kv")
    kv_heads = _per_layer(kv, layers) if kv is not None else heads
    head_dim = embedding // max(*heads, 1)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = _optional(reader, f"{arch}.vocab_size") or (len(tokens.data) if tokens is not None else 0)
    return LlamaShape(
        tensor_bytes=_tensor_bytes(path, reader), layers=layers,
        context_train=_int(reader, f"{arch}.context_length", path), embedding=embedding,
        feed_forward=max(_per_layer(_optional(reader, f"{arch}.feed_forward_length") or 0, layers)),
        vocab=int(vocab), heads=max(heads), kv_heads=kv_heads,
        key_length=int(_optional(reader, f"{arch}.attention.key_length") or head_dim),
        value_length=int(_optional(reader, f"{arch}.attention.value_length") or head_dim))


def run_settings(model: Model) -> LlamaRun:
    """The server settings that size its memory, from ``spec.config.args`` and the parallel slots."""
    args = config_args(model)
    return LlamaRun(context=_flag_int(args, _CONTEXT_FLAGS) or 0, parallel=parallel_requests(model) or 1,
                    unified=any(arg in _UNIFIED_FLAGS for arg in args),
                    k_bytes=_cache_type_bytes(flag_value(args, _K_TYPE_FLAGS), model),
                    v_bytes=_cache_type_bytes(flag_value(args, _V_TYPE_FLAGS), model),
                    ubatch=_flag_int(args, _UBATCH_FLAGS) or 512)


def _gguf() -> Any:
    """The ``gguf`` package (numpy comes with it: loaded only where a group packs by memory)."""
    try:
        import gguf
    except ImportError:
        raise EstimateError("the gguf package is not installed (pip install 'flexinfer[gguf]')") from None
    return gguf


def _reader(path: Path) -> Any:
    gguf = _gguf()
    try:
        return gguf.GGUFReader(path)
    except (OSError, ValueError, IndexError, KeyError) as exc:
        raise EstimateError(f"{path}: not a readable GGUF file ({exc})") from None


def _tensor_bytes(path: Path, reader: Any) -> int:
    """Every tensor's size, over every part of a split GGUF."""
    total = sum(int(tensor.n_bytes) for tensor in reader.tensors)
    split = _SPLIT.match(path.name)
    if split is None:
        return total
    for part in range(1, int(split["parts"]) + 1):
        other = path.with_name(f"{split['stem']}-{part:05d}-of-{split['parts']}.gguf")
        if other != path:
            if not other.is_file():
                raise EstimateError(f"{path}: part {other.name} of the split GGUF is missing")
            total += sum(int(tensor.n_bytes) for tensor in _reader(other).tensors)
    return total


def _optional(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _field(reader: Any, key: str, path: Path) -> Any:
    value = _optional(reader, key)
    if value is None:
        raise EstimateError(f"{path}: the GGUF header has no {key}")
    return value


def _int(reader: Any, key: str, path: Path) -> int:
    value = _field(reader, key, path)
    if not isinstance(value, int) or value <= 0:
        raise EstimateError(f"{path}: {key} is {value!r}, expected a positive integer")
    return value


def _per_layer(value: object, layers: int) -> list[int]:
    """A per-layer count: a list as given (one value per layer), or one value for every layer."""
    if isinstance(value, list):
        return [int(v) for v in value] or [0]
    return [int(value) if isinstance(value, int | float) else 0] * layers


def _flag_int(args: Sequence[str], flags: tuple[str, ...]) -> int | None:
    text = flag_value(args, flags)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"spec.config.args: {flags[0]} must be an integer, got {text!r}") from None


def _cache_type_bytes(name: str | None, model: Model) -> float:
    """Bytes per element of a KV cache type (``f16`` unless the args say otherwise)."""
    if name is None:
        return 2.0
    gguf = _gguf()
    try:
        kind = gguf.GGMLQuantizationType[name.upper()]
    except KeyError:
        raise ConfigError(f"{model.key}: spec.config.args: unknown KV cache type {name!r}") from None
    block, size = gguf.GGML_QUANT_SIZES[kind]
    return float(size) / float(block)
