"""llama-cpp-python's OpenAI server with the llama-server contract FlexInfer's ``llamacpp`` backend expects.

Accepts every ``python -m llama_cpp.server`` option (``--model``, ``--host``, ``--port``, ``--n_ctx``, ...)
and llama-server's ``--parallel N`` / ``-np N`` (the manager tells the backend its parallel capacity), and adds
``GET /health``, the backend's readiness and startup probe path. The model loads before the server listens, so
``/health`` answers only once the weights are in memory. llama-cpp-python generates for one request at a
time: requests never interrupt one another (``interrupt_requests`` off), and with ``--parallel`` above 1 the
extra ones wait in the server (a warning says so).
"""

from __future__ import annotations

import argparse
import sys

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
    parser.add_argument("--parallel", "-np", type=int, default=1, help="llama-server's slot count (see above)")
    args = parser.parse_args()
    if args.parallel < 1:
        parser.error("--parallel must be at least 1")
    if args.parallel > 1:
        print(f"warning: --parallel {args.parallel}: this server generates for one request at a time; the others "
              "wait", file=sys.stderr)
    server = parse_model_from_args(ServerSettings, args)
    server.interrupt_requests = False
    app = create_app(server_settings=server, model_settings=[parse_model_from_args(ModelSettings, args)])
    app.add_api_route("/health", health, methods=["GET"])
    uvicorn.run(app, host=server.host, port=server.port)


if __name__ == "__main__":
    main()
