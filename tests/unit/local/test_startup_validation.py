"""The shared manifest check as ``serve`` runs it: every problem is reported (never fatal there), with the
machine checks for every source."""

from __future__ import annotations

from pathlib import Path

from flexinfer.api import Manifest
from flexinfer.local.validation import check_manifests
from support.local_processes import make_model


class Nothing:
    """Only a ``srv`` program is installed."""

    python = "/py"

    def which(self, name: str) -> str | None:
        return "/bin/srv" if name == "srv" else None

    def has_module(self, name: str) -> bool:
        return False


def test_problems_name_each_model_and_field(tmp_path: Path) -> None:
    weights = tmp_path / "w.gguf"
    weights.write_bytes(b"x")
    models = [
        make_model("ok", weights.as_uri(), {"command": ["srv", "{port}"]}),
        make_model("remote", "hf://org/m", {"command": ["srv"]}),
        make_model("gone", (tmp_path / "gone.gguf").as_uri(), {"command": ["srv"]}),
        make_model("nobackend", weights.as_uri()),
        make_model("badargs", weights.as_uri(), {"args": "--ctx 5"}),
        make_model("noprogram", weights.as_uri(), {"command": ["my-server", "{port}"]}),
    ]
    manifests = [Manifest(model, "m.yaml", index) for index, model in enumerate(models)]
    problems = check_manifests(manifests, Nothing(), tmp_path, every_source=True)
    assert [p.document for p in problems] == [4, 1, 2, 3, 5]
    assert problems[0].message.startswith("spec.config.args must be a list of strings")
    assert "local mode cannot fetch" in problems[1].message
    assert "weights not found" in problems[2].message
    assert "no llamacpp backend is installed" in problems[3].message
    assert problems[4].message == "cannot start 'my-server' (spec.config.command): no such program on PATH"


def test_offline_skips_the_machine_checks(tmp_path: Path) -> None:
    manifests = [Manifest(make_model("gone", (tmp_path / "gone.gguf").as_uri()), "m.yaml", 0)]
    assert check_manifests(manifests, None, tmp_path) == []
    assert check_manifests(manifests, Nothing(), tmp_path) != []


def test_llama_cpp_settings_are_named_by_field(tmp_path: Path) -> None:
    configs = [{"llamacppServer": "cpp"}, {"promptCache": "yes"}, {"promptCacheMaxSize": "lots"},
               {"promptCacheMaxSize": 0}, {"promptCache": False, "promptCacheMaxSize": "512Mi"}]
    manifests = [Manifest(make_model(f"m{i}", "hf://org/m", config), "m.yaml", i) for i, config in enumerate(configs)]
    problems = check_manifests(manifests, None, tmp_path)
    assert [(p.document, p.message.split(":")[0]) for p in problems] == [
        (0, "spec.config.llamacppServer must be one of 'llama-server', 'python', got 'cpp'"),
        (1, "spec.config.promptCache must be true or false, got 'yes'"),
        (2, "spec.config.promptCacheMaxSize must be a positive quantity such as 512Mi, got 'lots'"),
        (3, "spec.config.promptCacheMaxSize must be a positive quantity such as 512Mi, got 0"),
    ]
