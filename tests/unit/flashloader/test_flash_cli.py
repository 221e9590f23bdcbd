"""``flexinfer flash-load``: env + flag precedence, summary, exit codes, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer.cli.main import main
from support.file_trees import read_tree, write_tree


def test_env_configures_and_summary_printed(
    src: Path, dst: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    write_tree(src, {"a.bin": b"aa", "skip/b.bin": b"b"})
    monkeypatch.setenv("FLASH_SRC", str(src))
    monkeypatch.setenv("FLASH_DST", str(dst))
    monkeypatch.setenv("FLASH_EXCLUDE", "skip/")
    assert main(["flash-load", "--quiet"]) == 0
    assert read_tree(dst) == {"a.bin": b"aa"}
    assert "flash-load: copied 1 files" in capsys.readouterr().out


def test_flags_override_env(
    src: Path, dst: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    write_tree(src, {"a.bin": b"aa", "skip/b.bin": b"b"})
    monkeypatch.setenv("FLASH_SRC", str(tmp_path / "wrong"))
    monkeypatch.setenv("FLASH_DST", str(tmp_path / "wrong-dst"))
    monkeypatch.setenv("FLASH_VERIFY", "maybe")
    code = main(["flash-load", "--src", str(src), "--dst", str(dst), "--exclude", "skip/", "--verify",
                 "--concurrency", "2", "--buffer-kb", "8", "--chunk-mib", "1", "--quiet"])
    assert code == 0 and read_tree(dst) == {"a.bin": b"aa"}
    assert not (tmp_path / "wrong-dst").exists()


def test_missing_required_is_one_line_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("FLASH_SRC", raising=False)
    monkeypatch.delenv("FLASH_DST", raising=False)
    assert main(["flash-load"]) == 1
    err = capsys.readouterr().err
    assert err == "error: FLASH_SRC is required (set the environment variable or pass --src)\n"


def test_per_file_failure_exits_non_zero(
    src: Path, dst: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    write_tree(src, {"a.bin": b"a", "b.bin": b"b"})
    write_tree(dst, {"a.bin/occupied": b"a directory sits at the file's final name"})
    code = main(["flash-load", "--src", str(src), "--dst", str(dst), "--quiet"])
    captured = capsys.readouterr()
    assert code == 1 and "1 FAILED" in captured.out
    assert captured.err.startswith("error: a.bin: ") and "Traceback" not in captured.err
    assert (dst / "b.bin").read_bytes() == b"b" and not (dst / "a.bin.flash-tmp").exists()


def test_bad_flag_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["flash-load", "--concurrency", "0"])
    assert caught.value.code == 2 and "--concurrency: must be ≥ 1, got 0" in capsys.readouterr().err


def test_a_bad_rate_cap_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["flash-load", "--max-rate", "fast"])
    assert caught.value.code == 2 and "--max-rate: expected bytes or a quantity" in capsys.readouterr().err
