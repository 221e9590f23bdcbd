"""A llama.cpp server's buffer sizes from its start-up log (lines captured from the real ``llama-server`` built
by hack/build-llama-server, at ``--verbosity 4``)."""

from __future__ import annotations

import pytest

from flexinfer.core.server_memory import HOST, ServerMemory, device_of, parse_memory

TINY = """\
0.00.007.659 I print_info: file size   = 0.46 MiB (32.00 BPW)
0.00.007.917 I load_tensors: loading model tensors, this can take a while... (load_mode = mmap)
0.00.008.158 I load_tensors:   CPU_Mapped model buffer size =     0.46 MiB
0.00.009.118 I llama_context:        CPU  output buffer size =     0.00 MiB
0.00.009.158 I llama_kv_cache:        CPU KV buffer size =     0.25 MiB
0.00.010.585 I sched_reserve:        CPU compute buffer size =     1.51 MiB
0.00.011.612 I srv    load_model: prompt cache is enabled, size limit: 8192 MiB
0.00.014.812 I srv  llama_server: model loaded
0.00.014.832 I srv  llama_server: listening on http://127.0.0.1:18556
""".splitlines()
TINY.insert(5, "0.00.009.327 I llama_kv_cache: size =    0.25 MiB (   512 cells,   2 layers,  4/1 seqs), "
               "K (f16):    0.12 MiB, V (f16):    0.12 MiB")  # a size line that is no buffer
LARGER = """\
0.00.106.377 I load_tensors:   CPU_Mapped model buffer size =   129.20 MiB
0.00.106.716 I llama_context:        CPU  output buffer size =     0.00 MiB
0.00.106.780 I llama_kv_cache:        CPU KV buffer size =    64.00 MiB
0.00.217.540 I sched_reserve:        CPU compute buffer size =    18.01 MiB
0.00.417.116 I srv  llama_server: model loaded
""".splitlines()


def test_the_tiny_models_buffers() -> None:
    memory = parse_memory(TINY)
    assert memory == ServerMemory(model_mib=0.46, kv_mib=0.25, compute_mib=1.51, other_mib=0.0,
                                  devices=((HOST, pytest.approx(2.22)),), complete=True)  # type: ignore[arg-type]
    assert memory is not None and memory.total_mib == pytest.approx(2.22)
    assert memory.as_json() == {"model_mib": 0.46, "kv_mib": 0.25, "compute_mib": 1.51, "other_mib": 0.0,
                                "total_mib": 2.22, "devices": {"host": 2.22}, "complete": True}


def test_a_larger_model_and_lines_not_yet_complete() -> None:
    memory = parse_memory(LARGER)
    assert memory is not None and (memory.model_mib, memory.kv_mib, memory.compute_mib) == (129.2, 64.0, 18.01)
    assert memory.complete
    partial = parse_memory(LARGER[:3])  # the pump has not delivered the rest yet
    assert partial is not None and not partial.complete and partial.compute_mib == 0.0


def test_gpu_and_host_buffers_are_split_by_device() -> None:
    """The format of llama.cpp's lines (``%12s model buffer size``…) for a model offloaded to a GPU, with a
    sliding-window model's two KV caches and a compute buffer reserved twice (the second replaces the first)."""
    lines = [
        "load_tensors:        ROCm0 model buffer size =  4403.49 MiB",
        "load_tensors:   CPU_Mapped model buffer size =   281.81 MiB",
        "llama_kv_cache:      ROCm0 KV buffer size =   512.00 MiB",
        "llama_kv_cache:      ROCm0 KV buffer size =    64.00 MiB",
        "llama_context:  ROCm_Host  output buffer size =     0.58 MiB",
        "sched_reserve:      ROCm0 compute buffer size =   300.00 MiB",
        "sched_reserve:  ROCm_Host compute buffer size =    16.01 MiB",
        "sched_reserve:      ROCm0 compute buffer size =   296.00 MiB",
    ]
    memory = parse_memory(lines)
    assert memory is not None and not memory.complete
    assert (memory.model_mib, memory.kv_mib) == (pytest.approx(4685.3), 576.0)
    assert memory.compute_mib == pytest.approx(312.01) and memory.other_mib == 0.58
    assert dict(memory.devices) == {"host": pytest.approx(298.4), "ROCm0": pytest.approx(5275.49)}
    assert [device for device, _ in memory.devices] == ["host", "ROCm0"]


@pytest.mark.parametrize(("name", "device"), [("CPU", HOST), ("CPU_Mapped", HOST), ("CPU_REPACK", HOST),
                                              ("CUDA_Host", HOST), ("ROCm0", "ROCm0"), ("Vulkan1", "Vulkan1")])
def test_buffer_types_map_to_devices(name: str, device: str) -> None:
    assert device_of(name) == device


def test_no_buffer_lines_is_none() -> None:
    """Another server, or llama-server at its default verbosity (3), which does not log its buffers."""
    assert parse_memory(["0.00.013.658 I srv  llama_server: model loaded", "INFO: Uvicorn running on"]) is None
    assert parse_memory([]) is None
