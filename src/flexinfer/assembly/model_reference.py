"""The model reference: every ``Model`` and ``ModelCache`` field with its type, default, meaning and the
engines that honour it, plus the ``spec.config`` keys FlexInfer reads.

Types, defaults and meanings come from the pydantic models in ``flexinfer.api`` (a field's description is the
docstring under it); which engine honours a field is kept here (``ENGINES``), and the free-form
``spec.config`` keys in ``CONFIG_KEYS``. ``docs/reference/models.md`` is this module's output
(``flexinfer settings --models``); a test fails when it drifts or when a field or config key is missing here.
Called by ``flexinfer.cli.settings``.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from flexinfer.api.base import Condition, ObjectMeta, ResourceRequirements, Toleration
from flexinfer.api.field_docs import field_description
from flexinfer.api.model import Model
from flexinfer.api.modelcache import ModelCache

BOTH, LOCAL, KUBE, NONE = "both", "local", "kubernetes", "none"
OPAQUE_TYPES: dict[type, str] = {
    ObjectMeta: "ObjectMeta", Toleration: "Toleration", ResourceRequirements: "ResourceRequirements",
    Condition: "Condition",
}
"""Kubernetes types shown by name, not expanded."""

ENGINES: dict[str, str] = {
    "metadata": BOTH, "spec": BOTH, "spec.backend": BOTH, "spec.source": BOTH, "spec.image": KUBE,
    "spec.gpu": BOTH, "spec.gpu.vendor": BOTH, "spec.gpu.shared": BOTH, "spec.gpu.priority": BOTH,
    "spec.gpu.count": BOTH, "spec.gpu.vramEstimateMB": KUBE, "spec.gpu.swapCooldown": KUBE,
    "spec.gpu.forcePromotion": KUBE,
    "spec.serverless": BOTH, "spec.serverless.enabled": BOTH, "spec.serverless.minReplicas": BOTH,
    "spec.serverless.idleTimeout": BOTH, "spec.serverless.coldStartTimeout": BOTH,
    "spec.cache": BOTH, "spec.cache.strategy": BOTH, "spec.cache.pvcName": KUBE, "spec.cache.storageClass": NONE,
    "spec.cache.size": NONE, "spec.cache.hostPath": KUBE, "spec.cache.compilationCache": KUBE,
    "spec.cache.compilationCache.enabled": KUBE, "spec.cache.compilationCache.hostPath": KUBE,
    "spec.cache.compilationCache.sizeLimit": NONE,
    "spec.cache.flashLoader": BOTH, "spec.cache.flashLoader.enabled": BOTH,
    "spec.cache.flashLoader.concurrency": BOTH, "spec.cache.flashLoader.tmpfsSizeLimit": BOTH,
    "spec.cache.flashLoader.bufferSizeKB": BOTH, "spec.cache.flashLoader.verifyIntegrity": BOTH,
    "spec.cache.flashLoader.image": KUBE,
    "spec.config": BOTH, "spec.resources": KUBE, "spec.nodeSelector": KUBE, "spec.tolerations": KUBE,
    "spec.serviceLabels": KUBE,
    "spec.litellm": BOTH, "spec.litellm.enabled": BOTH, "spec.litellm.servedModelName": BOTH,
    "spec.litellm.aliases": BOTH, "spec.litellm.copilotAlias": KUBE,
}
"""Which engine honours each ``Model`` spec field (``status.*`` is written by the Kubernetes manager)."""

CACHE_ENGINES: dict[str, str] = {
    "metadata": BOTH, "spec": BOTH, "spec.source": BOTH, "spec.flashLoader": BOTH,
    "spec.flashLoader.enabled": BOTH, "spec.flashLoader.concurrency": BOTH,
    "spec.flashLoader.tmpfsSizeLimit": BOTH, "spec.flashLoader.image": KUBE,
}
"""The ``ModelCache`` fields FlexInfer applies (``flexinfer serve`` reads the ModelCaches beside its Models);
every other field is accepted, unused."""


@dataclass(frozen=True)
class ConfigKey:
    """One ``spec.config`` key FlexInfer reads."""

    key: str
    type: str
    default: str
    engines: str
    meaning: str


CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("command", "list of strings", "the backend's launch profile", LOCAL,
              "The model server's command line. Placeholders: `{port}` (the port FlexInfer picked), `{model_path}` "
              "(the weights, or their staged copy), `{host}`, `{served_name}` (`spec.config.servedModelName`, "
              "else the model name) and `{python}` (FlexInfer's Python). Example: "
              "`[\"llama-server\", \"--port\", \"{port}\", \"-m\", \"{model_path}\"]`. Kubernetes uses the "
              "backend's image and arguments instead."),
    ConfigKey("args", "list of strings", "`[]`", BOTH,
              "Extra arguments of the model server, after FlexInfer's own, so they win where the server takes "
              "the last value: appended to the launch profile's command locally (ignored with `command`) and "
              "to the container's args in Kubernetes, unchanged. For `llama-server`, e.g. `[\"--ctx-size\", "
              "\"8192\", \"--threads\", \"8\"]` (its context comes from here: 0, the default, takes the model's "
              "own); it refuses a flag it does not know, so such a model fails to start with the server's message "
              "(its phase, `flexinfer ps`, the 503 a waiting request gets)."),
    ConfigKey("llamacppServer", "`llama-server` \\| `python`", "`llama-server`", LOCAL,
              "Which server runs a `llamacpp` model: llama.cpp's `llama-server` (on `PATH`), or `python`: "
              "llama-cpp-python's `python -m llama_cpp.server` (`pip install 'flexinfer[llamacpp]'`), never "
              "picked on its own. Choose `python` where no `llama-server` binary can be built or installed "
              "but a llama-cpp-python wheel can, or for its own options (`--chat_format`, `--n_ctx`-style "
              "flags in `args`); it runs one request at a time, has no slot prompt cache and no memory "
              "figures. Kubernetes runs the backend's image."),
    ConfigKey("env", "map of strings", "`{}`", LOCAL, "Extra environment variables of the model server process."),
    ConfigKey("healthPath", "string", "`/v1/models`", LOCAL,
              "Readiness path polled on the server with `command` (the launch profiles know their own)."),
    ConfigKey("startupTimeout", "duration (or seconds)", "`5m` local (`FLEXINFER_START_TIMEOUT`), `15m` Kubernetes",
              BOTH, "How long the server may take to become ready (local readiness budget; Kubernetes startup "
              "probe)."),
    ConfigKey("servedModelName", "string", "the model name (Kubernetes, backends other than llama.cpp and vLLM: "
              "the model id from `spec.source`)",
              BOTH, "The name the model server answers to: the proxy rewrites the request body's `model` to it "
              "(see \"Two served model names\")."),
    ConfigKey("parallel", "integer ≥ 1", "from `--parallel`/`-np`/`--max-num-seqs` in `args`, else 1 for llama.cpp, "
              "no limit for vLLM and `command`", BOTH,
              "How many requests the model server runs at once. The server is told (`llama-server --parallel`, "
              "vLLM `--max-num-seqs`) and the proxy forwards at most this many to it; the rest wait in the queue."),
    ConfigKey("promptCache", "boolean", "`true`", LOCAL,
              "Keep a `llama-server`'s prompt caches across a stop (swap, idle, unload, shutdown): its slots are "
              "saved before it stops and restored when it starts again, before it takes requests, so a prompt "
              "sent again is not prefilled again (`docs/user/prompt-cache.md`). `false` turns it off."),
    ConfigKey("promptCacheMaxSize", "quantity", "`2Gi`", LOCAL,
              "The most a model's saved prompt caches may take (slot files beyond it are not kept); they live "
              "beside the staged weights (tmpfs) or under `FLEXINFER_STATE_DIR`."),
    ConfigKey("runtimeProfile", "string", "by `spec.gpu.vendor`", KUBE,
              "Runtime profile (image flavour, device resources, environment) by name, e.g. `gfx1100`."),
    ConfigKey("warmPolicy", "string", "unset", KUBE,
              "`primary`: keep the shared group's leader warm (one replica) when the manager allows it."),
    ConfigKey("useFp16", "string", "unset", BOTH, "`\"1\"`: the flash-loader prefers `X.fp16.safetensors` files."),
)


@dataclass(frozen=True)
class FieldRow:
    """One row of a field table."""

    path: str
    type: str
    default: str
    engines: str
    meaning: str


def type_name(annotation: Any) -> str:
    """A short readable type (``duration``, ``"a" | "b"``, ``list of Toleration``, ``object``)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        extra = next((m.json_schema_extra for m in args[1:] if isinstance(m, FieldInfo)), None)
        return str(extra["format"]) if isinstance(extra, dict) and "format" in extra else type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(a) for a in args if a is not type(None))
    if origin is Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"map of {type_name(args[1])}"
    if annotation in OPAQUE_TYPES:
        return OPAQUE_TYPES[annotation]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    names = {str: "string", int: "integer", bool: "boolean", float: "number", Any: "any"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def default_text(info: FieldInfo) -> str:
    """The default as shown: a value, ``required``, or ``unset``."""
    if info.is_required():
        return "required"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        return f"`{value!r}`" if isinstance(value, list | dict) else "empty"
    if info.default is None:
        return "unset"
    if info.default == "":
        return '`""`'
    return f"`{str(info.default).lower() if isinstance(info.default, bool) else info.default}`"


def _field_type(info: FieldInfo) -> str:
    """``type_name``, except that a plain annotated type (pydantic unwraps it) shows its ``format``."""
    extra = info.json_schema_extra
    return str(extra["format"]) if isinstance(extra, dict) and "format" in extra else type_name(info.annotation)


def _nested(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model to expand under a field (``X``, ``X | None``), if any."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel) and candidate not in OPAQUE_TYPES:
            return candidate
    return None


def field_rows(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo, str]]:
    """``(dotted camelCase path, field, description)`` for every field of ``model``, depth first."""
    for name, info in model.model_fields.items():
        path = f"{prefix}{info.alias or name}"
        yield path, info, field_description(model, name) or ""
        nested = _nested(info.annotation)
        if nested is not None:
            yield from field_rows(nested, path + ".")


def rows(resource: type[BaseModel], engines: dict[str, str], *, status: str, unmapped: str | None) -> list[FieldRow]:
    """The rows of one resource (``apiVersion``/``kind`` left out): ``status.*`` fields get ``status``, other
    fields missing from ``engines`` get ``unmapped`` (``KeyError`` when that is ``None``)."""
    out = []
    for path, info, description in field_rows(resource):
        if path in ("apiVersion", "kind"):
            continue
        engine = engines.get(path) or (status if path.split(".")[0] == "status" else unmapped)
        if engine is None:
            raise KeyError(f"{resource.__name__} field {path} has no engine in flexinfer.assembly.model_reference")
        meaning = " ".join(description.split())
        out.append(FieldRow(path, _field_type(info), default_text(info), engine, meaning))
    return out


def model_rows() -> list[FieldRow]:
    """Every ``Model`` field (status written by the Kubernetes manager)."""
    return rows(Model, ENGINES, status=KUBE, unmapped=None)


def cache_rows() -> list[FieldRow]:
    """Every ``ModelCache`` field (unmapped fields and the status are accepted and unused)."""
    return rows(ModelCache, CACHE_ENGINES, status=NONE, unmapped=NONE)


ENGINE_TEXT = {BOTH: "both", LOCAL: "local", KUBE: "kubernetes", NONE: "none"}

INTRO = """\
# Model reference

Generated by `flexinfer settings --models`; do not edit by hand. Every field of the `Model`
(`ai.flexinfer/v1alpha2`) and `ModelCache` (`ai.flexinfer/v1alpha1`) resources: its type, default, meaning and
the engines that honour it: **local** (`flexinfer serve`), **kubernetes** (`flexinfer manager` + `flexinfer
proxy`), **both**, or **none** (accepted so existing manifests load, but not used). Durations are Go-style
(`90s`, `5m`, `1h30m`); quantities are Kubernetes quantities (`16Gi`). `flexinfer validate -f FILE` checks a
manifest against these rules and names the field of every problem.
"""

SERVED_NAMES = """\
## Two served model names

They are different names, so both stay:

- `spec.litellm.servedModelName` (and `spec.litellm.aliases`) is a **public** name: what clients may put in a
  request's `model` field, besides the model's own name and `namespace/name`. Kubernetes also writes it to the
  Service's `litellm.flexinfer.ai/served-model` annotation for a LiteLLM gateway.
- `spec.config.servedModelName` is the name the **model server** answers to: the proxy rewrites the request
  body's `model` to it before forwarding, and the server is told it (`llama-server --alias`, vLLM
  `--served-model-name`; locally also the `{served_name}` placeholder of `command`), so a response's `model` is
  this name in both engines, never a file path. Default: the model's name; in Kubernetes, for a backend whose
  server takes no such flag (Ollama, MLC LLM, …), the model id taken from `spec.source` (what its image loads,
  e.g. `qwen3:8b` for `ollama://qwen3:8b`).

Example: with `metadata.name: qwen3-8b`, `spec.litellm.servedModelName: chat` and
`spec.config.servedModelName: qwen3`, a request for `chat` (or `qwen3-8b`) reaches the server as `qwen3`.
"""


def _table(header: str, lines: list[tuple[str, ...]]) -> list[str]:
    columns = header.split("|")
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return out + ["| " + " | ".join(line) + " |" for line in lines]


def _field_lines(rows_: list[FieldRow], prefix: str) -> list[tuple[str, ...]]:
    return [(f"`{r.path}`", r.type, r.default, ENGINE_TEXT[r.engines], r.meaning)
            for r in rows_ if r.path.split(".")[0] == prefix]


def render_markdown() -> str:
    """The whole model reference (the content of ``docs/reference/models.md``)."""
    model, cache = model_rows(), cache_rows()
    header = "field|type|default|engines|meaning"
    out = [INTRO, "## `Model` spec", ""]
    out += _table(header, _field_lines(model, "metadata") + _field_lines(model, "spec"))
    out += ["", "## `spec.config` keys", "",
            "`spec.config` is a free-form map; these are the keys FlexInfer reads (other keys are kept and ignored).",
            ""]
    out += _table("key|type|default|engines|meaning",
                  [(f"`{k.key}`", k.type, k.default, ENGINE_TEXT[k.engines], k.meaning) for k in CONFIG_KEYS])
    out += ["", SERVED_NAMES, "## `Model` status", "",
            "Written by the Kubernetes manager (`kubectl get mdl -o yaml`); the local engine keeps its state in "
            "memory (`flexinfer status`).", ""]
    out += _table(header, _field_lines(model, "status"))
    out += ["", "## `ModelCache`", "",
            "Only a ModelCache's `spec.flashLoader` matters on the serving path: in Kubernetes it overrides the "
            "cluster's flash-loader defaults for the Models it matches (a Model's own `spec.cache.flashLoader` "
            "wins); `flexinfer serve` applies the ModelCaches among its manifests the same way.", ""]
    out += _table(header, _field_lines(cache, "metadata") + _field_lines(cache, "spec") + _field_lines(cache, "status"))
    return "\n".join(out) + "\n"
