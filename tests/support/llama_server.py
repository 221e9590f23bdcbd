"""llama.cpp's ``llama-server`` in the tests: whether it is installed, and the arguments the tiny models use.

``scripts/bootstrap`` builds it (``hack/build-llama-server``) and links it into ``${FLEXINFER_CACHE}/bin``, which
``scripts/check`` puts on ``PATH``; tests that start it are skipped with the command to run when it is not on
``PATH``. ``TINY_ARGS`` are the ``spec.config.args`` of the generated test models (512-token context, one
thread); ``PYTHON_SERVER`` is the ``spec.config`` that chooses llama-cpp-python's server instead (the tests
that cover its own behaviour).
"""

from __future__ import annotations

import importlib.util
import shutil
from typing import Any

import pytest

LLAMA_SERVER = shutil.which("llama-server")
TINY_ARGS = ["--ctx-size", "512", "--threads", "1"]
PYTHON_SERVER: dict[str, Any] = {"llamacppServer": "python", "args": ["--n_ctx", "512", "--n_threads", "1"]}

needs_llama_server = pytest.mark.skipif(
    LLAMA_SERVER is None,
    reason="llama-server not on PATH (run scripts/bootstrap, then PATH=~/.cache/flexinfer/bin:$PATH)")
needs_python_server = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python not installed (run: hack/build-llamacpp --install .venv/bin/python)")
