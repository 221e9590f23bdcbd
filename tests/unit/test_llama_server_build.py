"""The llama-server build and image recipe: the CPU build by default, the ROCm gfx1100 build as a build
argument (rendered, not built: there is no GPU here), and an image that runs the host-built binary."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "hack" / "build-llama-server"
HIP = "-DGGML_HIP=ON -DAMDGPU_TARGETS=gfx1100"


def configure(gpu: str | None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("FLEXINFER_LLAMACPP_GPU", "CMAKE_ARGS")}
    if gpu is not None:
        env["FLEXINFER_LLAMACPP_GPU"] = gpu
    return subprocess.run([str(BUILD), "--print-configure"], capture_output=True, text=True, env=env, timeout=30,
                          check=False)


def test_the_cpu_build_downloads_nothing_and_links_statically() -> None:
    line = configure(None).stdout
    assert line.startswith("cmake -S llama_cpp_python-0.3.36/vendor/llama.cpp -B BUILD")
    for flag in ("-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_CURL=OFF", "-DGGML_NATIVE=OFF"):
        assert flag in line
    assert "HIP" not in line


def test_the_rocm_gfx1100_build_is_a_build_argument() -> None:
    assert HIP in configure("rocm-gfx1100").stdout
    wrong = configure("cuda")
    assert wrong.returncode == 2 and "FLEXINFER_LLAMACPP_GPU must be empty or rocm-gfx1100" in wrong.stderr


def test_the_image_runs_the_binary_hack_build_images_copies_in() -> None:
    dockerfile = (ROOT / "images" / "llamacpp-server" / "Dockerfile").read_text()
    assert "COPY llama-server /usr/local/bin/llama-server" in dockerfile
    assert 'ENTRYPOINT ["/usr/local/bin/llama-server"]' in dockerfile
    assert "ARG BASE=python:3.11-slim" in dockerfile and HIP in dockerfile
    script = (ROOT / "hack" / "build-images").read_text()
    assert 'cp "$bin" "$ctx/llama-server"' in script and '--build-arg "BASE=$ROCM_BASE"' in script
    assert not (ROOT / "images" / "llamacpp-server" / "serve.py").exists()
