"""One supervised model-server child process, in its own process group, with captured output.

``ServerProcess.spawn`` starts the command in a new session (so the whole tree — the server and anything
it forks — can be signalled as one group), merges stdout/stderr into the model's ``ModelLog``, and exposes
``exited`` (an event set when the leader exits). ``terminate`` is SIGTERM → grace → SIGKILL for the group;
``kill`` is an immediate SIGKILL (also safe from a signal handler). Used by ``flexinfer.local.engine``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping, Sequence

from flexinfer.core.errors import EngineError
from flexinfer.local.logs import ModelLog, pump

log = logging.getLogger(__name__)
PUMP_DRAIN_SECONDS = 1.0


class ServerProcess:
    """A running child (group leader) and the task copying its output into a ``ModelLog``."""

    def __init__(self, proc: asyncio.subprocess.Process, output: ModelLog) -> None:
        self._proc = proc
        self.pid = proc.pid
        self.output = output
        self.exited = asyncio.Event()
        assert proc.stdout is not None
        self._pump = asyncio.create_task(pump(proc.stdout, output), name=f"log-pump-{proc.pid}")
        self._waiter = asyncio.create_task(self._wait_exit(), name=f"wait-{proc.pid}")

    @classmethod
    async def spawn(cls, argv: Sequence[str], env: Mapping[str, str], output: ModelLog,
                    cwd: str | None = None) -> ServerProcess:
        """Start ``argv`` in a new session with stdin closed and stdout+stderr captured into ``output``."""
        output.open_file()
        output.add_line(f"--- flexinfer: starting {' '.join(argv)}")
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, env=dict(env), cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
            )
        except OSError as exc:
            output.add_line(f"--- flexinfer: cannot start: {exc}")
            raise EngineError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc
        return cls(proc, output)

    @property
    def returncode(self) -> int | None:
        """The leader's exit status (negative = killed by that signal), ``None`` while running."""
        return self._proc.returncode

    async def _wait_exit(self) -> None:
        code = await self._proc.wait()
        self.output.add_line(f"--- flexinfer: process {self.pid} exited with {describe_exit(code)}")
        self.exited.set()

    async def wait(self) -> int:
        """Wait for the leader to exit; returns its status."""
        await self.exited.wait()
        code = self._proc.returncode
        assert code is not None
        return code

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

    async def terminate(self, grace: float) -> int:
        """SIGTERM the group, wait up to ``grace`` seconds for the leader, then SIGKILL what is left."""
        if not self.exited.is_set():
            self.signal_group(signal.SIGTERM)
            try:
                async with asyncio.timeout(grace):
                    await asyncio.shield(self.exited.wait())
            except TimeoutError:
                log.warning("process %s ignored SIGTERM for %.1fs; killing its group", self.pid, grace)
        self.kill()  # the leader is gone, but children it forked may not be
        return await self.close()

    async def close(self) -> int:
        """Wait for the leader (after a kill) and let the log pump finish; returns the exit status."""
        code = await asyncio.shield(self.wait())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(PUMP_DRAIN_SECONDS):
                await asyncio.shield(self._pump)
        if not self._pump.done():  # a grandchild that escaped the group still holds the pipe
            self._pump.cancel()
        self.output.flush()
        return code


def describe_exit(code: int) -> str:
    """``status 1`` / ``signal SIGKILL`` for a ``returncode``."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
        return f"signal {-code}"
    return f"status {code}"
