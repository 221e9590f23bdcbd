"""The model server's arguments in the rendered Deployment: the name it answers to is the local engine's
(``--alias`` for llama.cpp, ``--served-model-name`` for vLLM) and the one the in-cluster proxy rewrites
requests to; ``spec.config.args`` follow the manager's own arguments unchanged, for every backend, in the
order the local engine appends them."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer.api.model import Model
from flexinfer.cluster_proxy.catalog import backend_model_name
from flexinfer.core.controller_defaults import controller_defaults
from flexinfer.core.manifests.render import render_model
from flexinfer.core.profiles import BACKENDS
from flexinfer.local.profiles import plan_launch
from support.resource_builders import make_model

SOURCES = {"llamacpp": "pvc://weights/tiny-a.gguf", "ollama": "ollama://qwen3:8b"}
USER_ARGS = ["--ctx-size", 512, "--bogus-flag", "--alias=x y", ""]


def args_of(model: Model) -> list[str]:
    deployment = render_model(model, [], controller_defaults({}), 1)[0]
    container = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "model")
    args: list[str] = container.get("args", [])
    return args


def value_after(args: list[str] | tuple[str, ...], flag: str) -> str:
    return args[list(args).index(flag) + 1]


@pytest.mark.parametrize(("backend", "flag"), [
    ("llamacpp", "--alias"), ("vllm", "--served-model-name"), ("vllm-omni", "--served-model-name"),
])
@pytest.mark.parametrize(("spec", "name"), [
    ({}, "tiny-a"),
    ({"litellm": {"servedModelName": "chat"}}, "tiny-a"),  # a public name: the proxy resolves it
    ({"config": {"servedModelName": "qwen"}}, "qwen"),
])
def test_the_server_is_told_the_name_it_answers_to(backend: str, flag: str, spec: dict[str, Any],
                                                   name: str) -> None:
    model = make_model("tiny-a", backend=backend, source=SOURCES.get(backend, "HF://org/model"), **spec)
    args = args_of(model)
    assert args.count(flag) == 1 and value_after(args, flag) == name
    assert args.index(flag) == 6  # right after --model, --host and --port
    assert backend_model_name(model) == name  # the in-cluster proxy's body rewrite sends that name


def test_both_engines_give_llama_server_the_same_name() -> None:
    for spec in ({}, {"config": {"servedModelName": "qwen"}}, {"litellm": {"servedModelName": "chat"}}):
        model = make_model("tiny-a", backend="llamacpp", source="file:///w/tiny-a.gguf", **spec)
        local = plan_launch(model, "/w/tiny-a.gguf", 9000, "127.0.0.1", _LlamaServerInstalled()).argv
        assert value_after(args_of(model), "--alias") == value_after(local, "--alias"), spec


@pytest.mark.parametrize("backend", ["ollama", "mlc-llm", "diffusers", "comfyui"])
def test_servers_without_a_name_flag_are_told_none(backend: str) -> None:
    model = make_model("tiny-a", backend=backend, source=SOURCES.get(backend, "HF://org/model"))
    args = args_of(model)
    assert "--alias" not in args and "--served-model-name" not in args


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_config_args_come_last_and_unchanged_for_every_backend(backend: str) -> None:
    source = SOURCES.get(backend, "HF://org/model")
    plain = args_of(make_model("tiny-a", backend=backend, source=source))
    with_args = args_of(make_model("tiny-a", backend=backend, source=source, config={"args": USER_ARGS}))
    assert with_args == plain + [str(a) for a in USER_ARGS]


def test_the_local_engine_appends_config_args_last_and_unchanged_too() -> None:
    model = make_model("tiny-a", backend="llamacpp", source="file:///w/tiny-a.gguf", config={"args": USER_ARGS})
    argv = plan_launch(model, "/w/tiny-a.gguf", 9000, "127.0.0.1", _LlamaServerInstalled()).argv
    assert list(argv[-len(USER_ARGS):]) == [str(a) for a in USER_ARGS]


class _LlamaServerInstalled:
    """The local engine's view of a machine with ``llama-server`` on ``PATH``."""

    python = "/usr/bin/python3"

    def which(self, name: str) -> str | None:
        return f"/usr/bin/{name}" if name == "llama-server" else None

    def has_module(self, name: str) -> bool:
        return False


def test_llama_server_logs_its_buffer_sizes_in_both_engines_and_config_args_can_lower_it() -> None:
    """``--verbosity 4``: the level at which llama.cpp logs what it allocated, which the manager reads once the
    server is Ready (``core.measured_memory``), as the local engine does; ``spec.config.args`` come later."""
    model = make_model("tiny-a", backend="llamacpp", source="file:///w/tiny-a.gguf")
    args = args_of(model)
    local = plan_launch(model, "/w/tiny-a.gguf", 9000, "127.0.0.1", _LlamaServerInstalled()).argv
    assert value_after(args, "--verbosity") == value_after(local, "--verbosity") == "4"
    assert args.index("--verbosity") == args.index("--alias") + 2
    quiet = args_of(make_model("tiny-a", backend="llamacpp", source="file:///w/tiny-a.gguf",
                               config={"args": ["--verbosity", "3"]}))
    assert quiet[-2:] == ["--verbosity", "3"] and quiet.count("--verbosity") == 2
    assert "--verbosity" not in args_of(make_model("tiny-a", backend="vllm", source="HF://org/model"))
