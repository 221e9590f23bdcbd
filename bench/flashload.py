"""Flash-loader benchmark: ``cp -r`` vs ``shutil.copytree`` vs ``flexinfer flash-load`` (concurrency 1/4/8).

Run by hand (``python bench/flashload.py --big-gib 0.25``); prints figures, asserts nothing. Builds a
synthetic model directory (N big safetensors-like files + many small files) once on tmpfs and once on disk,
then times every method cold (empty destination) for tmpfs→tmpfs and disk→tmpfs, and the flash-loader's
warm re-run (unchanged tree). Disk reads are cold only when the page cache can be dropped (root); the
output says so otherwise. Sizes shrink automatically when /dev/shm or RAM is too small.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from flexinfer.flashloader.config import StageSettings
from flexinfer.flashloader.staging import stage_blocking

GIB = 2**30
BLOCK = 16 * 2**20


@dataclass
class Row:
    scenario: str
    method: str
    seconds: float
    nbytes: int


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big-gib", type=float, default=1.0, help="size of each big file (GiB)")
    parser.add_argument("--big-count", type=int, default=4)
    parser.add_argument("--small-count", type=int, default=200)
    parser.add_argument("--small-kib", type=int, default=64)
    parser.add_argument("--shm", default="/dev/shm", help="tmpfs to stage into")
    parser.add_argument("--disk", default="/var/tmp", help="disk directory for the disk source")
    parser.add_argument("--concurrency", default="1,4,8")
    return parser.parse_args()


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def fit_size(args: argparse.Namespace) -> None:
    """Shrink the big files until two copies fit in /dev/shm and RAM with room to spare."""
    shm = os.statvfs(args.shm)
    budget = min(shm.f_bavail * shm.f_frsize, mem_available()) * 0.7
    small = args.small_count * args.small_kib * 1024
    while 2 * (args.big_count * args.big_gib * GIB + small) > budget and args.big_gib > 0.01:
        args.big_gib /= 2
        print(f"note: scaled down to {args.big_gib:.3f} GiB per big file to fit /dev/shm and RAM")


def build_tree(root: Path, args: argparse.Namespace) -> int:
    block = os.urandom(BLOCK)
    big = int(args.big_gib * GIB)
    for index in range(args.big_count):
        with (root / f"model-{index + 1:05d}-of-{args.big_count:05d}.safetensors").open("wb") as handle:
            for offset in range(0, big, BLOCK):
                handle.write(block[: min(BLOCK, big - offset)])
    for index in range(args.small_count):
        sub = root / ("tokenizer" if index % 2 else "extra")
        sub.mkdir(exist_ok=True)
        (sub / f"part-{index:04d}.json").write_bytes(os.urandom(args.small_kib * 1024))
    os.sync()
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def fresh(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def timed(run) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    run()
    return time.perf_counter() - started


def flash_cli(src: Path, dst: Path, concurrency: int) -> tuple[float, float]:
    """Wall seconds of the whole command, and the staging seconds it reports."""
    command = [sys.executable, "-m", "flexinfer.cli.flash_load", "--quiet", "--src", str(src),
               "--dst", str(dst), "--concurrency", str(concurrency)]
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    wall = time.perf_counter() - started
    match = re.search(r"in ([0-9.]+) s", result.stdout)
    return wall, float(match.group(1)) if match else wall


def startup_cost() -> tuple[float, float]:
    """Seconds to start ``flexinfer flash-load --help`` (all subcommands) and the direct module entry."""
    full = timed(lambda: subprocess.run([sys.executable, "-m", "flexinfer.cli.main", "flash-load", "--help"],
                                        capture_output=True, check=True))
    direct = timed(lambda: subprocess.run([sys.executable, "-m", "flexinfer.cli.flash_load", "--help"],
                                          capture_output=True, check=True))
    return full, direct


def bench_scenario(name: str, src: Path, dst: Path, nbytes: int, levels: list[int], cold: bool) -> list[Row]:
    rows: list[Row] = []

    def prepare() -> None:
        fresh(dst)
        if cold:
            drop_caches()

    prepare()
    rows.append(Row(name, "cp -r", timed(lambda: subprocess.run(["cp", "-r", str(src), str(dst)], check=True)), nbytes))
    prepare()
    rows.append(Row(name, "shutil.copytree", timed(lambda: shutil.copytree(src, dst)), nbytes))
    for level in levels:
        prepare()
        wall, staging = flash_cli(src, dst, level)
        rows.append(Row(name, f"flash-load c={level} (process)", wall, nbytes))
        rows.append(Row(name, f"flash-load c={level} (staging)", staging, nbytes))
    prepare()
    again = timed(lambda: subprocess.run(["cp", "-r", str(src), str(dst)], check=True))
    rows.append(Row(name, "cp -r (again, last)", again, nbytes))
    fresh(dst)
    flash_cli(src, dst, levels[-1])
    warm_wall, warm_stage = flash_cli(src, dst, levels[-1])
    in_process = timed(lambda: stage_blocking(src, dst, StageSettings(concurrency=levels[-1])))
    print(f"[{name}] warm re-run: staging {warm_stage * 1000:.1f} ms, in-process stage() {in_process * 1000:.1f} ms, "
          f"whole command incl. interpreter start {warm_wall * 1000:.0f} ms")
    fresh(dst)
    return rows


def print_table(rows: list[Row]) -> None:
    print(f"\n{'scenario':<14} {'method':<30} {'seconds':>8} {'GB/s':>7} {'x cp -r':>8}")
    base: dict[str, float] = {}
    for row in rows:
        rate = row.nbytes / row.seconds / 1e9
        if row.method == "cp -r":
            base[row.scenario] = rate
        print(f"{row.scenario:<14} {row.method:<30} {row.seconds:>8.3f} {rate:>7.2f} {rate / base[row.scenario]:>8.2f}")


def main() -> None:
    args = parse_args()
    fit_size(args)
    levels = [int(x) for x in args.concurrency.split(",")]
    shm_root = Path(tempfile.mkdtemp(prefix="flashbench-", dir=args.shm))
    disk_root = Path(tempfile.mkdtemp(prefix="flashbench-", dir=args.disk))
    try:
        (shm_root / "src").mkdir()
        (disk_root / "src").mkdir()
        nbytes = build_tree(shm_root / "src", args)
        build_tree(disk_root / "src", args)
        cold = drop_caches()
        print(f"tree: {args.big_count} x {args.big_gib:.3f} GiB + {args.small_count} x {args.small_kib} KiB "
              f"= {nbytes / GIB:.2f} GiB; CPUs: {os.cpu_count()}; page-cache drop before disk runs: "
              f"{'yes' if cold else 'NOT PERMITTED (disk reads may be warm)'}")
        rows = bench_scenario("tmpfs->tmpfs", shm_root / "src", shm_root / "dst", nbytes, levels, cold=False)
        rows += bench_scenario("disk->tmpfs", disk_root / "src", shm_root / "dst", nbytes, levels, cold=cold)
        print_table(rows)
        full, direct = startup_cost()
        print(f"\nprocess rows use `python -m flexinfer.cli.flash_load` (start-up {direct * 1000:.0f} ms); "
              f"`flexinfer flash-load` start-up is {full * 1000:.0f} ms")
    finally:
        fresh(shm_root)
        fresh(disk_root)


if __name__ == "__main__":
    main()
