"""llama-cpp-python's OpenAI server with the llama-server contract FlexInfer's ``llamacpp`` backend expects.

Accepts every ``python -m llama_cpp.server`` option (``--model``, ``--host``, ``--port``, ``--n_ctx``, ...)
and adds ``GET /health``, the backend's readiness and startup probe path. The model loads before the
server listens, so ``/health`` answers only once the weights are in memory.
"""

from __future__ import annotations

import argparse

import uvicorn
from llama_cpp.server.app import create_app
from llama_cpp.server.cli import add_args_from_model, parse_model_from_args
from llama_cpp.server.settings import ModelSettings, ServerSettings, Settings


def health() -> dict[str, str]:
    """Liveness of a loaded model (llama-server answers ``{"status": "ok"}`` too)."""
    return {"status": "ok"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args_from_model(parser, Settings)
    args = parser.parse_args()
    server = parse_model_from_args(ServerSettings, args)
    app = create_app(server_settings=server, model_settings=[parse_model_from_args(ModelSettings, args)])
    app.add_api_route("/health", health, methods=["GET"])
    uvicorn.run(app, host=server.host, port=server.port)


if __name__ == "__main__":
    main()
