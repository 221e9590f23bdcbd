"""One supervised model-server child process, in its own process group, with captured output.

``ServerProcess.spawn`` starts the command in a new session (so the whole tree — the server and anything
it forks — can be signalled as one group) with a parent-death signal (SIGTERM when ``serve`` dies, even by
SIGKILL), merges stdout/stderr into the model's ``ModelLog``, and exposes ``exited`` (an event set when the
leader exits). ``terminate`` is SIGTERM → (after ``INTERRUPT_AFTER``) SIGINT → grace → SIGKILL for the
group; ``hurry`` does SIGTERM now and SIGKILL later without waiting (a second shutdown signal); ``kill`` is
an immediate SIGKILL (also safe from a signal handler). A server is only stopped once its requests are
over (drained, or abandoned by their clients), so what it still does on SIGTERM has nobody waiting: the
SIGINT is the second signal that makes servers such as uvicorn (llama-cpp-python, vLLM) stop waiting for
abandoned generations instead of holding the stop for the whole grace.
Waiting for the exit never depends on another task, so a cancelled watcher cannot leave a waiter hanging.
``last_server_line`` picks the server's own last line out of its output (why a server that exits at start
did). Used by ``flexinfer.local.engine``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence

from flexinfer.core.errors import EngineError
from flexinfer.local.logs import ModelLog, pump

log = logging.getLogger(__name__)
PUMP_DRAIN_SECONDS = 1.0
MARKER = "--- flexinfer: "
"""Starts the lines FlexInfer adds to a server's output (its command, its exit)."""
SAID_CHARS = 300
"""The most of a server's last line an error's first line quotes (``last_server_line``)."""
PARENT_DEATH_SIGNAL = signal.SIGTERM
"""What a child receives when ``serve`` dies without stopping it (Linux ``PR_SET_PDEATHSIG``)."""
_PR_SET_PDEATHSIG = 1
INTERRUPT_AFTER = 1.0
"""Seconds after SIGTERM before ``terminate`` adds a SIGINT (a server still running has no client left)."""


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl`` (Linux only), looked up in the parent: the child must not load libraries."""
    if not sys.platform.startswith("linux"):
        return None
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL(None, use_errno=True).prctl
    return None  # pragma: no cover - a libc without prctl


_PRCTL = _prctl()


def die_with_parent(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that asks the kernel to signal the child when ``parent`` dies (``None`` where
    unsupported). If the parent is already gone when it runs, the child ends itself at once."""
    prctl = _PRCTL
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


class ServerProcess:
    """A running child (group leader) and the task copying its output into a ``ModelLog``."""

    def __init__(self, proc: asyncio.subprocess.Process, output: ModelLog) -> None:
        self._proc = proc
        self.pid = proc.pid
        self.output = output
        self.exited = asyncio.Event()
        self._kill_timer: asyncio.TimerHandle | None = None
        assert proc.stdout is not None
        self._pump = asyncio.create_task(pump(proc.stdout, output), name=f"log-pump-{proc.pid}")
        self._waiter = asyncio.create_task(self._wait_exit(), name=f"wait-{proc.pid}")

    @classmethod
    async def spawn(cls, argv: Sequence[str], env: Mapping[str, str], output: ModelLog,
                    cwd: str | None = None) -> ServerProcess:
        """Start ``argv`` in a new session with stdin closed and stdout+stderr captured into ``output``."""
        output.open_file()
        output.add_line(f"{MARKER}starting {' '.join(argv)}")
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, env=dict(env), cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
                preexec_fn=die_with_parent(os.getpid()),
            )
        except OSError as exc:
            output.add_line(f"{MARKER}cannot start: {exc}")
            raise EngineError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        return cls(proc, output)

    @property
    def returncode(self) -> int | None:
        """The leader's exit status (negative = killed by that signal), ``None`` while running."""
        return self._proc.returncode

    async def _wait_exit(self) -> None:
        code = await self._proc.wait()
        self.output.add_line(f"{MARKER}process {self.pid} exited with {describe_exit(code)}")
        self.exited.set()
        if self._kill_timer is not None:
            self._kill_timer.cancel()

    async def wait(self) -> int:
        """Wait for the leader to exit; returns its status. Each call waits on the process itself (not on
        ``exited``), so it ends even if the task that sets ``exited`` was cancelled."""
        return await self._proc.wait()

    def signal_group(self, sig: signal.Signals) -> bool:
        """Send ``sig`` to the whole process group; ``False`` if no member is left."""
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            return False
        except PermissionError:  # pragma: no cover - the group id was reused by someone else's process
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the group now (synchronous; safe in signal handlers and at interpreter exit)."""
        self.signal_group(signal.SIGKILL)

    def hurry(self, grace: float) -> None:
        """SIGTERM the group now and SIGKILL it ``grace`` seconds later unless the leader exited (no wait)."""
        if self._proc.returncode is not None:
            self.kill()
            return
        self.signal_group(signal.SIGTERM)
        if self._kill_timer is None:
            self._kill_timer = asyncio.get_running_loop().call_later(grace, self.kill)

    async def terminate(self, grace: float) -> int:
        """SIGTERM the group (SIGINT too after ``INTERRUPT_AFTER``), wait up to ``grace`` seconds for the
        leader, then SIGKILL what is left."""
        if self._proc.returncode is None:
            self.signal_group(signal.SIGTERM)
            first = min(grace, INTERRUPT_AFTER)
            if not await self._exits_within(first):
                self.signal_group(signal.SIGINT)
                if not await self._exits_within(grace - first):
                    log.warning("process %s still running %.1fs after SIGTERM; sending SIGKILL to its group",
                                self.pid, grace)
        self.kill()  # the leader is gone, but children it forked may not be
        return await self.close()

    async def _exits_within(self, seconds: float) -> bool:
        try:
            async with asyncio.timeout(max(seconds, 0.0)):
                await self._proc.wait()
        except TimeoutError:
            return False
        return True

    async def close(self) -> int:
        """Wait for the leader (after a kill) and let the log pump finish; returns the exit status."""
        code = await self._proc.wait()
        if self._kill_timer is not None:
            self._kill_timer.cancel()
        if not self._pump.done():
            await asyncio.wait((self._pump,), timeout=PUMP_DRAIN_SECONDS)
        if not self._pump.done():  # a grandchild that escaped the group still holds the pipe
            self._pump.cancel()
        self.output.flush()
        return code


def last_server_line(lines: Sequence[str], limit: int = SAID_CHARS) -> str | None:
    """The server's own last non-blank line among ``lines`` (FlexInfer's ``--- flexinfer:`` lines skipped),
    cut to ``limit`` characters; ``None`` when it wrote nothing."""
    said = next((line.strip() for line in reversed(lines) if line.strip() and not line.startswith(MARKER)), None)
    if said is None or len(said) <= limit:
        return said
    return said[:limit - 1] + "…"


def describe_exit(code: int) -> str:
    """``status 1`` / ``signal SIGKILL`` for a ``returncode``."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"status {code}"
