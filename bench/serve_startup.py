"""``flexinfer serve`` start-up: wall time from exec to the ``listening on`` line (median of N runs), and the
import time of its composition root.

Run ``.venv/bin/python bench/serve_startup.py [--runs 5] [--baseline-src /path/to/previous/src]``. Each run
starts ``flexinfer serve -f DIR --port 0 --no-watch`` through the installed entry point (the console script a
group pod's container runs, so interpreter start-up is included) over one Model manifest whose weights file is
an empty placeholder (no model server starts: ``serve`` listens before any model is activated), reads its
output until ``listening on``, then stops it with SIGTERM. Every run gets a fresh state directory. Bytecode is
cached in a scratch ``PYTHONPYCACHEPREFIX`` (``PYTHONDONTWRITEBYTECODE`` dropped) and warmed by one untimed run,
as in the image, where ``pip install`` compiled it: without that, compiling FlexInfer's sources on every start
adds ~50 ms that no container pays. Rows: tracing
off (the default) and on (``FLEXINFER_OTEL_ENABLED=true``, exporting to a port nothing listens on; nothing is
exported before a span ends). The import figures come from ``python -X importtime -c "import
flexinfer.assembly.local"`` (cumulative microseconds of that module, median of the same runs, and the module
count). With ``--baseline-src``, the same runs also use that source tree first on ``PYTHONPATH``, interleaved
run by run so both see the same machine load. Prints figures only; never asserts on timings (the test
``tests/unit/cli/test_serve_imports.py`` guards what is imported instead).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cli_startup import arguments  # bench/ is this script's directory: first on sys.path

MANIFEST = """\
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata:
  name: tiny
spec:
  backend: llamacpp
  source: {source}
"""
TRACING_ON = {"FLEXINFER_OTEL_ENABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}


def manifest_dir(scratch: Path) -> Path:
    """A directory holding one Model manifest over an empty placeholder weights file."""
    weights = scratch / "tiny.gguf"
    weights.touch()
    models = scratch / "models"
    models.mkdir()
    (models / "tiny.yaml").write_text(MANIFEST.format(source=weights.as_uri()))
    return models


def environment(source: Path | None, extra: dict[str, str], pycache: Path) -> dict[str, str]:
    """The process environment plus ``extra``, bytecode cached under ``pycache``, with ``source`` first on
    ``PYTHONPATH`` when given."""
    env = {**os.environ, **extra, "PYTHONPYCACHEPREFIX": str(pycache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), os.environ.get("PYTHONPATH")]))
    return env


def until_listening(argv: list[str], env: dict[str, str], timeout: float = 60.0) -> float:
    """Seconds from starting ``argv`` to its ``listening on`` line; the process is then stopped (SIGTERM)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if "listening on" in line:
                return time.perf_counter() - started
        raise RuntimeError(f"{' '.join(argv)} exited {proc.wait()} without listening")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def import_micros(env: dict[str, str]) -> tuple[int, int]:
    """Cumulative import time (µs) of ``flexinfer.assembly.local`` in a fresh interpreter, and its module count."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", "import flexinfer.assembly.local"],
                          capture_output=True, text=True, check=True, env=env)
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:") and "[us]" not in line]
    root = next(line for line in lines if line.rstrip().endswith("| flexinfer.assembly.local"))
    return int(root.split("|")[1]), len(lines)


def measure(flexinfer: Path, models: Path, scratch: Path, envs: list[dict[str, str]],
            runs: int) -> list[tuple[float, float, int]]:
    """Per environment: median exec → listening seconds, median import µs and the module count; interleaved."""
    listening: list[list[float]] = [[] for _ in envs]
    imports: list[list[int]] = [[] for _ in envs]
    counts = [0 for _ in envs]
    argv = [str(flexinfer), "serve", "-f", str(models), "--port", "0", "--no-watch"]
    for index, env in enumerate(envs):  # untimed: writes the bytecode cache
        until_listening(argv, {**env, "FLEXINFER_STATE_DIR": str(scratch / f"state-warm-{index}")})
    for run in range(runs):
        for index, env in enumerate(envs):
            state = scratch / f"state-{run}-{index}"
            listening[index].append(until_listening(argv, {**env, "FLEXINFER_STATE_DIR": str(state)}))
            micros, counts[index] = import_micros(env)
            imports[index].append(micros)
    return [(statistics.median(seconds), statistics.median(micros), count)
            for seconds, micros, count in zip(listening, imports, counts, strict=True)]


def main() -> int:
    args = arguments(__doc__.splitlines()[0])
    sources: list[Path | None] = [None] + ([args.baseline_src] if args.baseline_src else [])
    labels = ["now"] + (["baseline"] if args.baseline_src else [])
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        models = manifest_dir(scratch)
        print("| tracing | " + " | ".join(f"{label}: exec → listening, import assembly.local, modules (median of "
                                         f"{args.runs})" for label in labels) + " |")
        print("|---|" + "---|" * len(labels))
        for row, extra in (("off", {}), ("on", TRACING_ON)):
            envs = [environment(source, extra, scratch / f"pycache-{index}") for index, source in enumerate(sources)]
            results = measure(args.flexinfer, models, scratch, envs, args.runs)
            cells = [f"{seconds * 1000:.0f} ms, {micros / 1000:.0f} ms, {count}" for seconds, micros, count in results]
            print(f"| {row} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
