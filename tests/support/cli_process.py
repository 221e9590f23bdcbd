"""A ``flexinfer`` command as a real child process, for integration tests and benchmarks.

``CliProcess(args, env)`` runs ``python -m flexinfer.cli.main <args>`` with stdout+stderr collected in
``output`` by a reader thread, which also catches the first ``listening on URL`` line. ``listening()`` and
``healthy(url)`` wait with a deadline and fail at once (with the output) if the process exits; ``stop()``
sends SIGTERM, waits, kills on timeout and returns the exit status; ``finish()`` waits for a command that
ends by itself.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

LISTENING = re.compile(r"listening on (http://\S+)")
TIMEOUT = 60.0


class CliProcess:
    """See the module docstring."""

    def __init__(self, args: Sequence[str], env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "flexinfer.cli.main", *args], env=dict(env),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output: list[str] = []
        self.url = ""
        self._listening = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout as stream:  # closed at EOF: the pipe is not left to the garbage collector
            for line in stream:
                self.output.append(line)
                match = LISTENING.search(line)
                if match and not self.url:
                    self.url = match.group(1)
                    self._listening.set()

    @property
    def log(self) -> str:
        return "".join(self.output)

    def listening(self, timeout: float = TIMEOUT) -> str:
        """The URL the command announced (deadline-bounded)."""
        deadline = time.monotonic() + timeout
        while not self._listening.wait(0.05):
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before listening:\n{self.log}"
            assert time.monotonic() < deadline, f"never announced a URL:\n{self.log}"
        return self.url

    def healthy(self, url: str, timeout: float = TIMEOUT) -> None:
        """Poll ``url`` until it answers 200, failing at once if the process exits."""
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, f"exited {self.proc.returncode} during start-up:\n{self.log}"
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            assert time.monotonic() < deadline, f"{url} never answered 200:\n{self.log}"
            time.sleep(0.05)

    def finish(self, timeout: float = TIMEOUT) -> int:
        """Wait for a command that ends by itself (killed after ``timeout``); returns the exit status."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"still running after {timeout}s:\n{self.log}") from None
        self._reader.join(5)
        return code

    def stop(self, timeout: float = TIMEOUT) -> int:
        """SIGTERM and wait; kill after ``timeout``; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(5)
        return code
