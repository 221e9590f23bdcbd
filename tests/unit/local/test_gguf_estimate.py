"""The GGUF estimate of a llama.cpp model's memory (flexinfer.local.gguf_estimate + core.memory_need), against
real files from the tests' own generator at several sizes: the tensor bytes and KV cache exactly, the total
within 15 % of what the real llama-server reports for the same file and settings."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from flexinfer.api.model import Model
from flexinfer.core.memory_need import LlamaRun, kv_cache_bytes, llama_mib
from flexinfer.core.server_memory import ServerMemory, parse_memory
from flexinfer.local.gguf_estimate import EstimateError, estimate_mib, read_shape, run_settings
from support.llama_server import LLAMA_SERVER, needs_llama_server
from support.polling import wait_until
from support.tiny_gguf import Dimensions, vocabulary, write_tiny_gguf

SIZES = {"tiny": Dimensions(), "small": Dimensions(embd=256, layers=4, ff=512, ctx=2048),
         "medium": Dimensions(embd=512, layers=8, ff=1536, ctx=4096)}
F32 = 4


def _model(path: Path, *args: str, parallel: int = 1, **config: Any) -> Model:
    return Model.model_validate({"metadata": {"name": "m"}, "spec": {
        "backend": "llamacpp", "source": f"file://{path}", "gpu": {"vendor": "cpu", "shared": "g"},
        "config": {"parallel": parallel, "args": list(args), **config}}})


def _weights(dims: Dimensions) -> int:
    """The generator's tensors: embeddings and output, two norms per layer, four attention and three
    feed-forward matrices per layer, all f32."""
    vocab = len(vocabulary()[0])
    per_layer = 2 * dims.embd + 4 * dims.embd * dims.embd + 3 * dims.ff * dims.embd
    return F32 * (2 * vocab * dims.embd + dims.embd + dims.layers * per_layer)


@pytest.mark.parametrize("size", SIZES)
def test_the_header_gives_the_tensor_bytes_and_the_kv_cache_exactly(tmp_path: Path, size: str) -> None:
    dims = SIZES[size]
    shape = read_shape(write_tiny_gguf(tmp_path / f"{size}.gguf", dims=dims))
    assert shape.tensor_bytes == _weights(dims)
    assert (shape.layers, shape.embedding, shape.context_train, shape.vocab) == (
        dims.layers, dims.embd, dims.ctx, len(vocabulary()[0]))
    # f16 keys and values of every layer for the trained context of each of 2 slots
    assert kv_cache_bytes(shape, LlamaRun(parallel=2)) == 2 * dims.ctx * dims.layers * 2 * dims.embd * 2
    # --ctx-size is the total llama.cpp divides among the slots; q8_0 takes 34 bytes per 32 elements
    assert kv_cache_bytes(shape, LlamaRun(context=1024, parallel=4, k_bytes=34 / 32)) == \
        1024 * dims.layers * dims.embd * (34 / 32 + 2)


def test_the_manifest_args_size_the_run(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf")
    run = run_settings(_model(path, "--ctx-size", "2048", "-ctk", "q8_0", "--cache-type-v=q4_0", "-ub", "256",
                              "--kv-unified", parallel=3))
    assert run == LlamaRun(context=2048, parallel=3, unified=True, k_bytes=34 / 32, v_bytes=18 / 32, ubatch=256)
    small, large = (estimate_mib(_model(path, "-c", str(n)), tmp_path) for n in (512, 4096))
    assert small is not None and large is not None and large > small
    with pytest.raises(EstimateError, match="--ctx-size must be an integer"):
        estimate_mib(_model(path, "--ctx-size", "lots"), tmp_path)
    with pytest.raises(EstimateError, match="unknown KV cache type 'q9'"):
        estimate_mib(_model(path, "-ctk", "q9"), tmp_path)


def test_a_split_gguf_counts_every_part_and_a_missing_part_is_named(tmp_path: Path) -> None:
    one = write_tiny_gguf(tmp_path / "split" / "m-00001-of-00002.gguf")
    write_tiny_gguf(tmp_path / "split" / "m-00002-of-00002.gguf", seed=1)
    assert read_shape(one).tensor_bytes == 2 * _weights(Dimensions())
    (tmp_path / "split" / "m-00002-of-00002.gguf").unlink()
    with pytest.raises(EstimateError, match=r"part m-00002-of-00002\.gguf of the split GGUF is missing"):
        read_shape(one)


def test_no_estimate_for_other_servers_and_a_clear_error_for_a_broken_file(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "m.gguf")
    assert estimate_mib(_model(path, command=["my-server", "{model_path}"]), tmp_path) is None
    assert estimate_mib(_model(tmp_path / "missing.gguf"), tmp_path) is None
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(EstimateError, match=r"broken\.gguf"):
        estimate_mib(_model(broken), tmp_path)


def _served_memory(path: Path, args: list[str], tmp_path: Path) -> float:
    """The total a real llama-server logs for ``path`` (its buffer lines at --verbosity 4)."""
    log = tmp_path / f"{path.stem}.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(LLAMA_SERVER), "--model", str(path), "--port", "0", "--threads", "1",
                                 "--verbosity", "4", *args], stdout=out, stderr=subprocess.STDOUT)
    def loaded() -> ServerMemory | None:
        assert proc.poll() is None, f"llama-server exited: {log.read_text()[-2000:]}"
        memory = parse_memory(log.read_text(errors="replace").splitlines())
        return memory if memory is not None and memory.complete else None

    try:
        return wait_until(loaded, 60, "llama-server to log its buffers").total_mib
    finally:
        proc.kill()
        proc.wait()


@needs_llama_server
@pytest.mark.parametrize(("size", "args", "parallel"), [
    ("tiny", ["--ctx-size", "512"], 1), ("small", ["--ctx-size", "1024"], 2), ("medium", [], 1), ("small", [], 3)])
def test_the_estimate_is_within_15_percent_of_what_llama_server_reports(
        tmp_path: Path, size: str, args: list[str], parallel: int) -> None:
    path = write_tiny_gguf(tmp_path / f"{size}.gguf", dims=SIZES[size])
    estimate = llama_mib(read_shape(path), run_settings(_model(path, *args, parallel=parallel)))
    served = _served_memory(path, [*args, "--parallel", str(parallel)], tmp_path)
    assert abs(estimate - served) <= 0.15 * served, (estimate, served)
