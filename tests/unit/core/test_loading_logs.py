"""The loading substage read from a model server's log tail: vLLM shard progress, graph capture, server up,
llama.cpp markers; the newest matching line wins; progress-bar redraws and colour codes are handled."""

from __future__ import annotations

import pytest

from flexinfer.core.loading_logs import refine_from_log
from flexinfer.core.model_status.build import MESSAGE_LIMIT, LoadingDetail

SHARDS = "Loading safetensors checkpoint shards:  50% Completed | 2/4 [00:01<00:01,  1.50it/s]"
UVICORN = "INFO:     Uvicorn running on http://0.0.0.0:8000 (Press CTRL+C to quit)"
CAPTURE = "Capturing CUDA graph shapes:  40%|████      | 14/35 [00:05<00:08,  2.45it/s]"


@pytest.mark.parametrize("lines,expected", [
    ([SHARDS], LoadingDetail("LoadingWeights", "loading weights (2/4 shards, 1.50it/s)")),
    (["Loading safetensors checkpoint shards:   0% Completed | 0/4 [00:00<?, ?it/s]"],
     LoadingDetail("LoadingWeights", "loading weights (0/4 shards)")),
    (["Loading safetensors checkpoint shards: 25% Completed | 1/4 [00:03<00:09, 3.10s/it]"],
     LoadingDetail("LoadingWeights", "loading weights (1/4 shards, 3.10s/it)")),
    (["Loading safetensors checkpoint shards:   0% Completed | 0/2 [00:00<?, ?it/s]\r"
      "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:02<00:02,  2.01s/it]\r"],
     LoadingDetail("LoadingWeights", "loading weights (1/2 shards, 2.01s/it)")),
    ([SHARDS, CAPTURE], LoadingDetail("Compiling", f"compiling: {CAPTURE}")),
    ([SHARDS, CAPTURE, "INFO 06-01 12:00:00 other noise", UVICORN],
     LoadingDetail("HealthCheckPending", f"server up, health check pending: {UVICORN}")),
    (["INFO:     Application startup complete."],
     LoadingDetail("HealthCheckPending", "server up, health check pending: INFO:     Application startup complete.")),
    (["load_tensors: offloaded 33/33 layers to GPU"],
     LoadingDetail("LoadingWeights", "loading weights: load_tensors: offloaded 33/33 layers to GPU")),
    (["load_tensors: offloaded 33/33 layers to GPU",
      "main: server is listening on http://0.0.0.0:8080 - starting the main loop"],
     LoadingDetail("HealthCheckPending", "server up, health check pending: main: server is listening on "
                   "http://0.0.0.0:8080 - starting the main loop")),
    (["0.00.006.007 I srv    load_model: loading model '/models/tiny.gguf'"],  # the real llama-server, -lv 3
     LoadingDetail("LoadingWeights", "loading weights: 0.00.006.007 I srv    load_model: loading model "
                   "'/models/tiny.gguf'")),
    (["0.00.006.007 I srv    load_model: loading model '/models/tiny.gguf'",
      "0.00.013.658 I srv  llama_server: model loaded",
      "0.00.013.680 I srv  llama_server: listening on http://0.0.0.0:8080"],
     LoadingDetail("HealthCheckPending", "server up, health check pending: 0.00.013.680 I srv  llama_server: "
                   "listening on http://0.0.0.0:8080")),
    (["\x1b[32mINFO\x1b[0m:     Uvicorn running on http://0.0.0.0:8000"],
     LoadingDetail("HealthCheckPending", "server up, health check pending: INFO:     Uvicorn running on "
                   "http://0.0.0.0:8000")),
])
def test_the_newest_matching_line_decides(lines: list[str], expected: LoadingDetail) -> None:
    assert refine_from_log(lines) == expected


@pytest.mark.parametrize("lines", [[], ["INFO starting", "downloading model.safetensors"], [""]])
def test_no_marker_is_no_refinement(lines: list[str]) -> None:
    assert refine_from_log(lines) is None


def test_long_lines_are_cut_to_the_message_limit() -> None:
    detail = refine_from_log(["Capturing CUDA graph " + "x" * 500])
    assert detail is not None and detail.substage == "Compiling"
    assert len(detail.message) == MESSAGE_LIMIT and detail.message.endswith("…")


@pytest.mark.parametrize("lines,expected", [
    (["flash-load: copying 12 files, 16000.0 MiB"],
     "staging weights into tmpfs: 0.0 of 16000.0 MiB (0%), 0/12 files"),
    (["flash-load: copying 12 files, 16000.0 MiB", "flash-load: 1234.5/16000.0 MiB (8%), 3/12 files, 1.20 GB/s",
      "flash-load: copied model-00001.safetensors (4000.0 MiB)"],
     "staging weights into tmpfs: 1234.5 of 16000.0 MiB (8%), 3/12 files"),
])
def test_flash_loader_progress_is_bytes_and_files_without_the_rate(lines: list[str], expected: str) -> None:
    assert refine_from_log(lines) == LoadingDetail("LoadingWeights", expected)


def test_the_same_bytes_at_another_rate_is_the_same_message() -> None:
    """The rate falls while a copy hangs; only bytes count as progress."""
    fast = refine_from_log(["flash-load: 10.0/20.0 MiB (50%), 1/2 files, 1.00 GB/s"])
    slow = refine_from_log(["flash-load: 10.0/20.0 MiB (50%), 1/2 files, 0.01 GB/s"])
    assert fast == slow


def test_a_checksum_pass_is_progress_too() -> None:
    assert refine_from_log(["flash-load: checksumming 2 files, 40.0 MiB"]) == LoadingDetail(
        "LoadingWeights", "checksumming weights: 0.0 of 40.0 MiB (0%), 0/2 files")
    assert refine_from_log(["flash-load: checksummed 10.0/40.0 MiB (25%), 1/2 files, 0.50 GB/s"]) == LoadingDetail(
        "LoadingWeights", "checksumming weights: 10.0 of 40.0 MiB (25%), 1/2 files")
