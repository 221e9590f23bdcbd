"""Refining the loading substage from a model server's (or the flash-loader's) recent output (spec §3.8).

While the primary container runs but its readiness probe does not pass yet, its container state only says
"running"; while the ``flash-loader`` init container runs, only that it stages. The last lines of the
container's log say more; the newest line that matches one of these markers decides:

- the flash-loader's progress lines (``flash-load: 1234.5/16000.0 MiB (8%), 3/12 files, 1.20 GB/s``, written
  at most every 5 s while bytes move, ``flexinfer.flashloader.progress.LogProgress``) and its opening line
  (``flash-load: copying 12 files, 16000.0 MiB``) → ``LoadingWeights`` with
  ``staging weights into tmpfs: 1234.5 of 16000.0 MiB (8%), 3/12 files`` — bytes and files only (no rate),
  so the message changes exactly when bytes were staged and a copy that stops moving still looks stalled;
  with ``verify``, its checksum passes likewise (``flash-load: checksummed 10.0/20.0 MiB (50%), 1/2 files``
  → ``checksumming weights: 10.0 of 20.0 MiB (50%), 1/2 files``);

- ``Uvicorn running on`` / ``Application startup complete`` (vLLM, llama-cpp-python) or llama.cpp's
  ``server is listening on`` / ``llama_server: listening on`` (logged once the model is loaded) →
  ``HealthCheckPending``;
- ``Capturing CUDA graph`` / ``Capturing HIP graph`` / ``torch.compile`` → ``Compiling``;
- ``Loading safetensors checkpoint shards: … 2/4 [… 1.50it/s]`` (vLLM) → ``LoadingWeights`` with
  ``loading weights (2/4 shards, 1.50it/s)``; llama.cpp's ``load_tensors:`` lines and ``llama-server``'s
  ``load_model: loading model`` (the one line it logs while loading at its default verbosity) →
  ``LoadingWeights``.

Pure; the manager's reconcile plan names the container (``flexinfer.core.unit_actions.MemberAction.log``), the
reconciler (``flexinfer.manager.reconciler``) fetches the lines and ``MemberAction.with_log`` folds them in.
A changed substage or message moves ``status.loadingProgressAt``, which feeds the proxy's stalled-load
detector.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from flexinfer.core.model_status.build import LoadingDetail, short_message

LOG_TAIL_LINES: Final = 200
"""How many of the newest log lines the manager reads."""

_HEALTH_MARKERS: Final = ("uvicorn running on", "application startup complete", "server is listening on",
                          "llama_server: listening on")
_COMPILE_MARKERS: Final = ("capturing cuda graph", "capturing hip graph", "capturing cudagraph", "torch.compile")
_SHARDS: Final = "loading safetensors checkpoint shards"
_LLAMACPP_LOADING: Final = ("load_tensors:", "load_model: loading model")
_SHARD_PROGRESS: Final = re.compile(r"(\d+)/(\d+)\s*\[[^\]]*?([\d.]+\s*(?:it/s|s/it))?\s*\]")
_ANSI: Final = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STAGED: Final = re.compile(r"flash-load: (checksummed )?([\d.]+)/([\d.]+) MiB \((\d+)%\), (\d+)/(\d+) files")
_STAGE_BEGIN: Final = re.compile(r"flash-load: (copying|checksumming) (\d+) files, ([\d.]+) MiB")
_TASKS: Final = {"": "staging weights into tmpfs", "copying": "staging weights into tmpfs",
                 "checksummed ": "checksumming weights", "checksumming": "checksumming weights"}


def refine_from_log(lines: Sequence[str]) -> LoadingDetail | None:
    """The substage the newest matching line shows; ``None`` when no line matches."""
    for raw in reversed(lines):
        line = _last_segment(raw)
        detail = _classify(line)
        if detail is not None:
            return detail
    return None


def _last_segment(raw: str) -> str:
    """Progress bars redraw with carriage returns: keep the last drawn state, without colour codes."""
    return _ANSI.sub("", raw.rstrip("\r\n").rsplit("\r", 1)[-1]).strip()


def _classify(line: str) -> LoadingDetail | None:
    staged = _staging_message(line)
    if staged is not None:
        return LoadingDetail("LoadingWeights", staged)
    lower = line.lower()
    if any(marker in lower for marker in _HEALTH_MARKERS):
        return LoadingDetail("HealthCheckPending", short_message(f"server up, health check pending: {line}"))
    if any(marker in lower for marker in _COMPILE_MARKERS):
        return LoadingDetail("Compiling", short_message(f"compiling: {line}"))
    if _SHARDS in lower:
        return LoadingDetail("LoadingWeights", _shard_message(line))
    if any(marker in lower for marker in _LLAMACPP_LOADING):
        return LoadingDetail("LoadingWeights", short_message(f"loading weights: {line}"))
    return None


def _staging_message(line: str) -> str | None:
    """The flash-loader's progress, as bytes and files staged so far (``None`` for other lines)."""
    match = _STAGED.search(line)
    if match is not None:
        task, done, total, percent, files_done, files = match.groups()
        return f"{_TASKS[task or '']}: {done} of {total} MiB ({percent}%), {files_done}/{files} files"
    begin = _STAGE_BEGIN.search(line)
    if begin is not None:
        task, files, total = begin.groups()
        return f"{_TASKS[task]}: 0.0 of {total} MiB (0%), 0/{files} files"
    return None


def _shard_message(line: str) -> str:
    match = _SHARD_PROGRESS.search(line)
    if match is None:
        return "loading weights"
    current, total, rate = match.groups()
    return f"loading weights ({current}/{total} shards" + (f", {rate.replace(' ', '')})" if rate else ")")
