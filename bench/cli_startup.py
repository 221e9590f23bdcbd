"""CLI start-up: wall time of short ``flexinfer`` commands (median of N runs) and what each one imports.

Run ``.venv/bin/python bench/cli_startup.py [--runs 5] [--baseline-src /path/to/previous/src]``. Each command
runs as its own process through the installed ``flexinfer`` entry point (the console script a user types), so
interpreter start-up is included. ``ps`` asks a port nothing listens on (it answers "cannot reach" at once),
and ``flash-load`` stages a one-file tree into a temporary directory. With ``--baseline-src``, the same
commands also run with that source tree first on ``PYTHONPATH`` (an A/B comparison in one run), interleaved run
by run so both see the same machine load. The module count comes from one more run under
``python -X importtime -m flexinfer.cli.main``. Prints figures only; never asserts on timings (the test
``tests/unit/cli/test_cli_imports.py`` guards what is imported instead).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_FLEXINFER = Path(sys.executable).with_name("flexinfer")


def commands(scratch: Path) -> dict[str, list[str]]:
    """Label → arguments of every measured command."""
    src, dst = scratch / "src", scratch / "dst"
    src.mkdir(exist_ok=True)
    (src / "weights.bin").write_bytes(b"w" * 4096)
    return {
        "--version": ["--version"],
        "--help": ["--help"],
        "ps --help": ["ps", "--help"],
        "ps (no server)": ["ps", "--url", "127.0.0.1:9"],
        "load --help": ["load", "--help"],
        "unload --help": ["unload", "--help"],
        "logs --help": ["logs", "--help"],
        "completion bash": ["completion", "bash"],
        "flash-load --help": ["flash-load", "--help"],
        "flash-load (1 file)": ["flash-load", "--src", str(src), "--dst", str(dst), "--quiet"],
    }


def environment(source: Path | None) -> dict[str, str]:
    """The process environment, with ``source`` first on ``PYTHONPATH`` when given."""
    if source is None:
        return dict(os.environ)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(source), os.environ.get("PYTHONPATH")]))}


def wall_seconds(argv: list[str], envs: list[dict[str, str]], runs: int) -> list[float]:
    """Median wall time of ``runs`` executions of ``argv`` under each environment, interleaved."""
    samples: list[list[float]] = [[] for _ in envs]
    for _ in range(runs):
        for index, env in enumerate(envs):
            started = time.perf_counter()
            subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False)
            samples[index].append(time.perf_counter() - started)
    return [statistics.median(values) for values in samples]


def imported_modules(arguments: list[str], env: dict[str, str]) -> int:
    """How many modules one run of ``flexinfer <arguments>`` imports (``-X importtime`` lines)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "flexinfer.cli.main", *arguments],
                          capture_output=True, text=True, check=False, env=env)
    return sum(1 for line in done.stderr.splitlines() if line.startswith("import time:") and "[us]" not in line)


def arguments(description: str) -> argparse.Namespace:
    """The start-up benches' options: ``--runs``, ``--flexinfer`` (the entry point) and ``--baseline-src``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--runs", type=int, default=5, help="runs per row (the median is shown)")
    parser.add_argument("--flexinfer", type=Path, default=DEFAULT_FLEXINFER, help="the entry point to run")
    parser.add_argument("--baseline-src", type=Path, help="a previous source tree (its src/) to compare with")
    return parser.parse_args()


def main() -> int:
    args = arguments(__doc__.splitlines()[0])
    envs = [environment(None)] + ([environment(args.baseline_src)] if args.baseline_src else [])
    labels = ["now"] + (["baseline"] if args.baseline_src else [])
    with tempfile.TemporaryDirectory() as scratch:
        print("| command | " + " | ".join(f"{label}: median of {args.runs}, modules" for label in labels) + " |")
        print("|---|" + "---|" * len(labels))
        for label, argv in commands(Path(scratch)).items():
            medians = wall_seconds([str(args.flexinfer), *argv], envs, args.runs)
            cells = [f"{seconds * 1000:.0f} ms, {imported_modules(argv, env)}"
                     for seconds, env in zip(medians, envs, strict=True)]
            print(f"| `flexinfer {label}` | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
