"""Fault cases for ``flexinfer flash-load`` against real processes and filesystems.

Runs the real command as a subprocess (exit codes, stderr, SIGKILL) and uses a real size-limited tmpfs as
the destination. Tests run as root, where ``chmod 000`` does not block reads: unreadable-source cases use a
path that does not exist, a file or FIFO where the directory should be, and real permission failures by
running the command without the capabilities that let root bypass file modes (``setpriv``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexinfer.core.errors import InsufficientSpaceError
from flexinfer.flashloader.config import StageSettings
from flexinfer.flashloader.staging import stage_blocking
from support.file_trees import write_hf_snapshot

pytestmark = pytest.mark.integration


def flash_load(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    command = [*prefix, sys.executable, "-m", "flexinfer.cli.main", "flash-load", "--quiet", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLASH_")}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env, check=False)


def start_flash_load(*args: str) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "flexinfer.cli.main", "flash-load", *args]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_one_line_error(result: subprocess.CompletedProcess[str], needle: str) -> None:
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert needle in result.stderr and result.stderr.count("\n") == 1


def poll(condition, deadline_s: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.001)
    return False


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MiB tmpfs (needs root); skips when mounting is not allowed."""
    mount_point = tmp_path / "tmpfs"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot mount tmpfs: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_missing_source(tmp_path: Path) -> None:
    result = flash_load("--src", str(tmp_path / "nope"), "--dst", str(tmp_path / "dst"))
    assert_one_line_error(result, "does not exist")


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_source_that_is_not_a_directory(tmp_path: Path, kind: str) -> None:
    source = tmp_path / "model"
    source.write_bytes(b"x") if kind == "file" else os.mkfifo(source)
    result = flash_load("--src", str(source), "--dst", str(tmp_path / "dst"))
    assert_one_line_error(result, "is not a directory")


def test_unreadable_file_and_directory_without_root_override(tmp_path: Path) -> None:
    """Root normally reads mode-000 files; dropping CAP_DAC_OVERRIDE/READ_SEARCH makes permissions real."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) not installed")
    drop = (setpriv, "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search", "--")
    src = tmp_path / "src"
    (src / "locked").mkdir(parents=True)
    (src / "ok.bin").write_bytes(b"fine")
    (src / "secret.bin").write_bytes(b"no")
    (src / "locked" / "x.bin").write_bytes(b"x")
    (src / "secret.bin").chmod(0o000)
    (src / "locked").chmod(0o000)
    try:
        result = flash_load("--src", str(src), "--dst", str(tmp_path / "dst"), prefix=drop)
    finally:
        (src / "locked").chmod(0o755)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "error: secret.bin: Permission denied" in result.stderr
    assert "error: locked: cannot list directory: Permission denied" in result.stderr
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["ok.bin"]


def test_destination_full_preflight_on_real_tmpfs(tmp_path: Path, small_tmpfs: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(3 * 2**20))
    result = flash_load("--src", str(src), "--dst", str(small_tmpfs / "model"))
    assert_one_line_error(result, "insufficient tmpfs space")
    needed = 3 * 2**20 + 10 * 2**20
    assert f"need {needed} bytes" in result.stderr and "bytes free" in result.stderr
    assert list((small_tmpfs / "model").iterdir()) == []


def plenty(_path: str) -> int:
    """A free-space probe that passes the preflight, so the copy itself meets the real ENOSPC."""
    return 2**40


def test_destination_fills_up_during_copy(tmp_path: Path, small_tmpfs: Path) -> None:
    """A copy that runs out of space fails that file only; files staged earlier stay intact."""
    src = tmp_path / "src"
    src.mkdir()
    fits = os.urandom(2**20)
    (src / "fits.bin").write_bytes(fits)
    first = stage_blocking(src, small_tmpfs / "m", free_space=plenty)
    assert first.failures == () and (small_tmpfs / "m" / "fits.bin").read_bytes() == fits
    (src / "too-big.bin").write_bytes(os.urandom(12 * 2**20))
    with pytest.raises(InsufficientSpaceError):
        stage_blocking(src, small_tmpfs / "m")
    report = stage_blocking(src, small_tmpfs / "m", free_space=plenty)
    assert [issue.path for issue in report.failures] == ["too-big.bin"]
    assert "No space left on device" in report.failures[0].reason
    assert sorted(p.name for p in (small_tmpfs / "m").iterdir()) == ["fits.bin"]
    assert (small_tmpfs / "m" / "fits.bin").read_bytes() == fits


def test_kill_mid_copy_then_rerun_completes(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    payload = os.urandom(2**20) * 256
    (src / "big.safetensors").write_bytes(payload)
    tmp_file = dst / "big.safetensors.flash-tmp"
    process = start_flash_load("--src", str(src), "--dst", str(dst), "--concurrency", "1", "--buffer-kb", "1")
    try:
        assert poll(lambda: tmp_file.exists() and tmp_file.stat().st_size > 0), "copy never started"
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate()
    assert tmp_file.exists() and not (dst / "big.safetensors").exists()
    rerun = flash_load("--src", str(src), "--dst", str(dst))
    assert rerun.returncode == 0, rerun.stderr
    assert "1 stale temp files removed" in rerun.stdout
    assert (dst / "big.safetensors").read_bytes() == payload
    assert sorted(p.name for p in dst.iterdir()) == ["big.safetensors"]


def test_file_growing_during_copy_from_a_writer_thread(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "log.bin").write_bytes(os.urandom(2**20))

    class AppendOnce:
        done = False

        def begin(self, files: int, total_bytes: int) -> None: ...
        def file_done(self, rel: str, size: int) -> None: ...
        def end(self) -> None: ...

        def advance(self, nbytes: int) -> None:
            if not self.done:
                self.done = True
                with (src / "log.bin").open("ab") as handle:
                    handle.write(b"appended while copying")

    report = stage_blocking(src, dst, StageSettings(concurrency=1, buffer_kb=4), AppendOnce())
    assert "changed during copy" in report.failures[0].reason
    assert list(dst.iterdir()) == []


def test_symlink_loops_and_escapes_via_cli(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    (src / "a").mkdir(parents=True)
    (src / "a" / "w.bin").write_bytes(b"w")
    (src / "a" / "loop").symlink_to("..")
    (src / "self").symlink_to("self")
    (src / "etc").symlink_to("/etc")
    (src / "passwd").symlink_to("/etc/passwd")
    result = flash_load("--src", str(src), "--dst", str(dst))
    assert result.returncode == 0, result.stderr
    files = sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*"))
    assert files == ["a", "a/w.bin"]
    assert result.stderr.count("(not followed)") == 4
    assert "ignored passwd: symlink to /etc/passwd outside the source root (not followed)" in result.stderr
    assert "ignored etc: symlink to /etc outside the source root (not followed)" in result.stderr


def test_hugging_face_cache_on_the_model_volume_via_cli(tmp_path: Path) -> None:
    """The Kubernetes layout: the model volume holds ``HF_HOME=.cache/huggingface``; the server reads the
    snapshot files under the same paths in the tmpfs."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    files = {"config.json": b"{}", "model-00001-of-00002.safetensors": os.urandom(200_000),
             "model-00002-of-00002.safetensors": os.urandom(100_000)}
    snapshot = write_hf_snapshot(src / ".cache" / "huggingface" / "hub", "org/tiny", "abc123", files)
    result = flash_load("--src", str(src), "--dst", str(dst), "--verify")
    assert result.returncode == 0, result.stderr
    assert "copied 4 files" in result.stdout
    staged = dst / snapshot.relative_to(src)
    assert {p.name: p.read_bytes() for p in staged.iterdir()} == files
    assert not any(p.is_symlink() for p in dst.rglob("*"))
    assert not (staged.parent.parent / "blobs").exists()


def test_nothing_selected_from_a_non_empty_source_fails_via_cli(tmp_path: Path) -> None:
    snapshot = write_hf_snapshot(tmp_path / "hub", "org/tiny", "abc123", {})
    snapshot.mkdir(parents=True)
    (tmp_path / "elsewhere.json").write_bytes(b"{}")
    (snapshot / "config.json").symlink_to("../../../../elsewhere.json")  # leaves the repository folder
    result = flash_load("--src", str(snapshot), "--dst", str(tmp_path / "dst"))
    assert_one_line_error(result, "nothing to stage")
    assert ("config.json: symlink to ../../../../elsewhere.json outside the source root and its Hugging Face "
            "repository folder") in result.stderr
    only_git = tmp_path / "git"
    (only_git / ".git").mkdir(parents=True)
    (only_git / ".git" / "HEAD").write_bytes(b"ref")
    assert_one_line_error(flash_load("--src", str(only_git), "--dst", str(tmp_path / "dst2")), "excluded: .git/")
