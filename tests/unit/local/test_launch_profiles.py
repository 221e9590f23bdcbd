"""Backend launch profiles: variant choice, placeholders, explicit commands and their errors."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from flexinfer.core.errors import EngineError
from flexinfer.core.profiles import served_name
from flexinfer.local.profiles import PROFILES, plan_launch, substitute
from support.local_processes import make_model


@dataclass(frozen=True)
class Pretend:
    """An Availability with a fixed set of binaries and modules."""

    binaries: frozenset[str] = frozenset()
    modules: frozenset[str] = frozenset()
    python: str = "/py/bin/python"
    calls: list[str] = field(default_factory=list)

    def which(self, name: str) -> str | None:
        return f"/usr/bin/{name}" if name in self.binaries else None

    def has_module(self, name: str) -> bool:
        return name in self.modules


def test_llamacpp_runs_llama_server_even_when_the_python_server_is_installed() -> None:
    model = make_model("a", "file:///m.gguf")
    plan = plan_launch(model, "/m.gguf", 9001, "127.0.0.1",
                       Pretend(binaries=frozenset({"llama-server"}), modules=frozenset({"llama_cpp"})))
    assert plan.argv == ("llama-server", "--model", "/m.gguf", "--host", "127.0.0.1", "--port", "9001",
                         "--alias", "a", "--verbosity", "4", "--parallel", "1")
    assert plan.health_path == "/health"
    assert plan.origin == "llamacpp via llama-server"
    assert plan.slot_dir is None


def test_llama_server_gets_the_slot_directory_and_the_args_last() -> None:
    model = make_model("a", "file:///m.gguf", {"args": ["--ctx-size", 512, "--verbosity", "3"]})
    plan = plan_launch(model, "/m.gguf", 9001, "127.0.0.1", Pretend(binaries=frozenset({"llama-server"})),
                       slot_dir="/shm/a.prompt-cache")
    assert plan.argv[-8:] == ("--parallel", "1", "--slot-save-path", "/shm/a.prompt-cache", "--ctx-size", "512",
                              "--verbosity", "3")  # the user's verbosity comes after FlexInfer's: it wins
    assert plan.slot_dir == "/shm/a.prompt-cache"


def test_a_slot_save_path_in_the_args_is_the_users_own() -> None:
    model = make_model("a", "file:///m.gguf", {"args": ["--slot-save-path", "/mine"]})
    plan = plan_launch(model, "/m.gguf", 1, "h", Pretend(binaries=frozenset({"llama-server"})), slot_dir="/x")
    assert plan.slot_dir is None and plan.argv.count("--slot-save-path") == 1 and "/x" not in plan.argv


def test_the_python_server_runs_only_when_chosen() -> None:
    with pytest.raises(EngineError, match=r"no llamacpp backend is installed.*llamacppServer: python"):
        plan_launch(make_model("a", "file:///m.gguf"), "/m", 1, "h", Pretend(modules=frozenset({"llama_cpp"})))
    config = {"args": ["--n_ctx", 512], "servedModelName": "tiny", "llamacppServer": "python"}
    plan = plan_launch(make_model("a", "file:///m.gguf", config), "/m.gguf", 9001, "127.0.0.1",
                       Pretend(binaries=frozenset({"llama-server"}), modules=frozenset({"llama_cpp"})),
                       slot_dir="/x")
    assert plan.argv == ("/py/bin/python", "-m", "llama_cpp.server", "--model", "/m.gguf", "--host", "127.0.0.1",
                         "--port", "9001", "--model_alias", "tiny", "--interrupt_requests", "False",
                         "--n_ctx", "512")
    assert plan.health_path == "/v1/models" and plan.slot_dir is None
    assert dict(plan.env) == {"HOST": "127.0.0.1", "PORT": "9001", "MODEL": "/m.gguf", "INTERRUPT_REQUESTS": "false"}
    assert plan.origin == "llamacpp via python -m llama_cpp.server"


def test_a_chosen_server_that_is_missing_or_unknown_is_named() -> None:
    with pytest.raises(EngineError, match=r"spec\.config\.llamacppServer is 'python' but python -m llama_cpp"):
        plan_launch(make_model("a", "file:///m", {"llamacppServer": "python"}), "/m", 1, "h",
                    Pretend(binaries=frozenset({"llama-server"})))
    with pytest.raises(EngineError, match=r"spec\.config\.llamacppServer must be one of 'llama-server', 'python', "
                                          r"got 'llama_cpp'"):
        plan_launch(make_model("a", "file:///m", {"llamacppServer": "llama_cpp"}), "/m", 1, "h",
                    Pretend(binaries=frozenset({"llama-server"})))
    chosen = plan_launch(make_model("a", "file:///m", {"llamacppServer": "llama-server"}), "/m", 1, "h",
                         Pretend(binaries=frozenset({"llama-server"})))
    assert chosen.argv[0] == "llama-server"


@pytest.mark.parametrize(("config", "tail"), [
    ({"parallel": 4}, ("--parallel", "4")),
    ({"args": ["--parallel", "2"]}, ("--parallel", "2")),  # the user's own flag is not doubled
])
def test_llama_server_is_told_its_slots(config: dict, tail: tuple[str, ...]) -> None:
    model = make_model("a", "file:///m.gguf", config)
    plan = plan_launch(model, "/m.gguf", 1, "h", Pretend(binaries=frozenset({"llama-server"})))
    assert plan.argv[-2:] == tail and plan.argv.count("--parallel") == 1


def test_invalid_parallel_is_an_engine_error_naming_the_field() -> None:
    with pytest.raises(EngineError, match=r"spec\.config\.parallel must be a positive integer"):
        plan_launch(make_model("a", "file:///m.gguf", {"parallel": -1}), "/m", 1, "h",
                    Pretend(binaries=frozenset({"llama-server"})))


def test_llama_cpp_alias_resolves_to_the_same_profile() -> None:
    model = make_model("a", "file:///m.gguf", backend="llama.cpp")
    assert plan_launch(model, "/m", 1, "h", Pretend(binaries=frozenset({"llama-server"}))).argv[0] == "llama-server"


def test_nothing_installed_names_the_fix() -> None:
    with pytest.raises(EngineError, match=r"no llamacpp backend is installed.*hack/build-llama-server.*"
                                          r"flexinfer\[llamacpp\]"):
        plan_launch(make_model("a", "file:///m.gguf"), "/m", 1, "h", Pretend())


def test_vllm_profile() -> None:
    plan = plan_launch(make_model("v", "file:///w", backend="vllm"), "/w", 7, "127.0.0.1",
                       Pretend(binaries=frozenset({"vllm"})))
    assert plan.argv[:3] == ("vllm", "serve", "/w") and "--port" in plan.argv and plan.health_path == "/health"


def test_backend_without_profile_needs_a_command() -> None:
    with pytest.raises(EngineError, match=r"backend 'ollama' has no local launch profile.*spec\.config\.command"):
        plan_launch(make_model("o", "file:///w", backend="ollama"), "/w", 7, "h", Pretend())


def test_explicit_command_wins_and_keeps_unknown_braces() -> None:
    config = {"command": ["srv", "--port={port}", "{model_path}", "--json", '{"a": 1}'],
              "healthPath": "/ready", "env": {"X": "1", "N": 2}}
    plan = plan_launch(make_model("c", "file:///w", config), "/w", 5, "127.0.0.1", Pretend())
    assert plan.argv == ("srv", "--port=5", "/w", "--json", '{"a": 1}')
    assert plan.health_path == "/ready"
    assert dict(plan.env) == {"X": "1", "N": "2"}
    assert plan.origin == "spec.config.command"


def test_explicit_command_default_health_path() -> None:
    plan = plan_launch(make_model("c", "file:///w", {"command": ["srv"]}), "/w", 5, "h", Pretend())
    assert plan.health_path == "/v1/models"


@pytest.mark.parametrize("config, message", [
    ({"command": "srv --port {port}"}, "must be a non-empty list of strings"),
    ({"command": []}, "must be a non-empty list of strings"),
    ({"command": ["srv"], "healthPath": "health"}, "healthPath must be a path"),
    ({"command": ["srv"], "env": ["X=1"]}, "spec.config.env must map names"),
    ({"args": "--ctx-size 5"}, "spec.config.args must be a list"),
])
def test_malformed_config_is_named(config: dict, message: str) -> None:
    with pytest.raises(EngineError, match=message):
        plan_launch(make_model("c", "file:///w", config), "/w", 5, "h", Pretend(binaries=frozenset({"llama-server"})))


def test_served_name_precedence() -> None:
    assert served_name(make_model("n", "file:///w")) == "n"
    assert served_name(make_model("n", "file:///w", litellm={"servedModelName": "client-facing"})) == "n"
    assert served_name(make_model("n", "file:///w", {"servedModelName": "cfg"})) == "cfg"


def test_substitute_only_known_placeholders() -> None:
    assert substitute(["{port}{port}", "{nope}"], {"port": "1"}) == ("11", "{nope}")


def test_profiles_are_data() -> None:
    assert set(PROFILES) == {"llamacpp", "vllm"}
    assert [v.binary or v.module for v in PROFILES["llamacpp"].variants] == ["llama-server", "llama_cpp"]
    assert [v.explicit for v in PROFILES["llamacpp"].variants] == [False, True]
