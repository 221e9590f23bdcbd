"""A process-level fault-injection stub for the local-engine tests (run as ``python stub_server.py ...``).

It is deliberately not an OpenAI server (``support.fake_openai`` is): it exercises what the engine sees of a
process — start-up delay, exit before listening, a crash after Ready, a forked grandchild, ignoring SIGTERM,
503 while "loading". It answers ``GET <health path>`` with 200 and prints its argv and selected
environment variables so tests can check what the engine passed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--startup-delay", type=float, default=0.0)
    parser.add_argument("--exit-before-ready", type=int, default=None, help="exit with this status at start")
    parser.add_argument("--crash-after", type=float, default=None, help="exit(3) this long after listening")
    parser.add_argument("--loading-for", type=float, default=0.0, help="answer 503 this long after listening")
    parser.add_argument("--grandchild", action="store_true", help="fork a long-lived child and print its pid")
    parser.add_argument("--ignore-term", action="store_true")
    parser.add_argument("--print-env", action="append", default=[])
    parser.add_argument("--model", default="")
    return parser.parse_args()


def make_handler(ready_at: float) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = 200 if time.monotonic() >= ready_at else 503
            body = b'{"object":"list","data":[{"id":"stub"}]}'
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def main() -> None:
    args = parse_args()
    print(f"stub argv: {' '.join(sys.argv[1:])}", flush=True)
    for name in args.print_env:
        print(f"stub env {name}={os.environ.get(name, '<unset>')}", flush=True)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.grandchild:
        child = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(60)"])
        print(f"stub grandchild pid {child.pid}", flush=True)
    if args.exit_before_ready is not None:
        print("stub: fatal error while loading weights", flush=True)
        sys.exit(args.exit_before_ready)
    time.sleep(args.startup_delay)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(time.monotonic() + args.loading_for))
    if args.crash_after is not None:
        threading.Timer(args.crash_after, lambda: os._exit(3)).start()
    print(f"stub listening on {args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
