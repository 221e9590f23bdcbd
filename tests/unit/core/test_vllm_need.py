"""vLLM's memory need (flexinfer.core.vllm_need): on a GPU the share of the card vLLM reserves whatever its weights,
on the CPU the weights plus the KV cache space; ``None`` when a figure is missing, a ``ConfigError`` naming the
field for a value vLLM would refuse."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer.api.model import Model
from flexinfer.core.errors import ConfigError
from flexinfer.core.memory_need import MIB
from flexinfer.core.vllm_need import need_mib, utilization

CARD = 24576.0


def model(*args: str | float, backend: str = "vllm", gpu: dict[str, Any] | None = None, **config: Any) -> Model:
    spec: dict[str, Any] = {"backend": backend, "source": "file:///m", "config": {"args": list(args), **config}}
    if gpu is not None:
        spec["gpu"] = gpu
    return Model.model_validate({"metadata": {"name": "m"}, "spec": spec})


GPU = {"vendor": "amd", "shared": "g"}


@pytest.mark.parametrize(("args", "share"), [
    ((), 0.9),
    (("--gpu-memory-utilization", "0.5"), 0.5),
    (("--gpu-memory-utilization=0.25",), 0.25),
    (("--gpu-memory-utilization", 0.4), 0.4),
    (("--max-model-len", "4096", "--gpu-memory-utilization", "0.3", "--gpu-memory-utilization=0.6"), 0.6),
    (("--gpu-memory-utilization", "1"), 1.0),
])
def test_on_a_gpu_the_need_is_the_utilization_times_the_device_whatever_the_weights(
        args: tuple[str, ...], share: float) -> None:
    m = model(*args, gpu=GPU)
    assert utilization(m) == share
    assert need_mib(m, device_mib=CARD, weights_bytes=1) == pytest.approx(share * CARD)


def test_with_several_gpus_the_share_is_of_the_memory_of_all_of_them() -> None:
    m = model("--gpu-memory-utilization", "0.5", gpu={**GPU, "count": 2})
    assert need_mib(m, device_mib=2 * CARD, weights_bytes=None) == pytest.approx(CARD)


@pytest.mark.parametrize("value", ["0", "1.5", "-0.2", "half", "nan", ""])
def test_a_utilization_vllm_would_refuse_is_an_error_naming_the_flag(value: str) -> None:
    args = ("--gpu-memory-utilization", value) if value else ("--gpu-memory-utilization",)
    with pytest.raises(ConfigError, match=r"default/m: spec\.config\.args: --gpu-memory-utilization must be a "
                                          r"fraction in \(0, 1\]"):
        need_mib(model(*args, gpu=GPU), device_mib=CARD, weights_bytes=None)


def test_an_unknown_device_gives_no_figure_on_a_gpu() -> None:
    assert need_mib(model(gpu=GPU), device_mib=None, weights_bytes=10 * MIB) is None
    assert need_mib(model(gpu=GPU), device_mib=0.0, weights_bytes=10 * MIB) is None


def test_on_the_cpu_the_need_is_the_weights_plus_the_kv_space() -> None:
    weights = 300 * MIB + 512
    assert need_mib(model(), device_mib=CARD, weights_bytes=weights) == pytest.approx(300.0 + 512 / MIB + 4096.0)
    assert need_mib(model(gpu={"vendor": "cpu", "shared": "g"}, env={"VLLM_CPU_KVCACHE_SPACE": "2"}),
                    device_mib=None, weights_bytes=weights) == pytest.approx(300.0 + 512 / MIB + 2048.0)
    assert need_mib(model(), device_mib=None, weights_bytes=None) is None


def test_the_kv_space_comes_from_the_model_env_then_the_inherited_one_then_the_default() -> None:
    inherited = {"VLLM_CPU_KVCACHE_SPACE": "8"}
    assert need_mib(model(), device_mib=None, weights_bytes=0, inherited_env=inherited) == 8192.0
    assert need_mib(model(env={"VLLM_CPU_KVCACHE_SPACE": 1}), device_mib=None, weights_bytes=0,
                    inherited_env=inherited) == 1024.0
    assert need_mib(model(env={"VLLM_CPU_KVCACHE_SPACE": "0"}), device_mib=None, weights_bytes=0) == 4096.0
    with pytest.raises(ConfigError, match=r"spec\.config\.env: VLLM_CPU_KVCACHE_SPACE must be a number of GiB"):
        need_mib(model(env={"VLLM_CPU_KVCACHE_SPACE": "lots"}), device_mib=None, weights_bytes=0)
    with pytest.raises(ConfigError, match=r"the environment: VLLM_CPU_KVCACHE_SPACE must be a number of GiB"):
        need_mib(model(), device_mib=None, weights_bytes=0, inherited_env={"VLLM_CPU_KVCACHE_SPACE": "-1"})


@pytest.mark.parametrize("other", [model(backend="llamacpp", gpu=GPU), model(backend="vllm-omni", gpu=GPU),
                                   model(gpu=GPU, command=["my-server", "--port", "{port}"])])
def test_other_backends_and_custom_commands_get_no_vllm_figure(other: Model) -> None:
    assert need_mib(other, device_mib=CARD, weights_bytes=MIB) is None
