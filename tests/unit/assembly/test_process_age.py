"""``process_age``: seconds since the process started, from the kernel's record (serve's ``started in``)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from flexinfer.assembly.process_age import process_age

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")

CHILD = """
import time, sys
from flexinfer.assembly.process_age import process_age
deadline = time.monotonic() + float(sys.argv[1])
while time.monotonic() < deadline:  # busy until then: the age must count the whole life, not CPU time
    pass
print(process_age())
"""


def test_a_child_reports_at_least_the_time_it_has_lived_and_not_more_than_its_parent_saw() -> None:
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-c", CHILD, "0.5"], capture_output=True, text=True, check=True).stdout
    lived = time.monotonic() - started
    age = float(out)
    tick = 0.011  # the kernel records the start to a clock tick (10 ms at 100 Hz)
    assert 0.5 - tick <= age <= lived + tick


def test_this_process_is_older_than_a_moment_ago() -> None:
    first = process_age()
    assert first is not None and first > 0
    second = process_age()
    assert second is not None and second >= first


def test_a_command_name_with_spaces_and_parentheses_is_read_past(tmp_path: Path) -> None:
    stat = Path("/proc/self/stat").read_text()
    head, tail = stat.split(" (", 1)
    _, rest = tail.rsplit(")", 1)
    odd = tmp_path / "stat"
    odd.write_text(f"{head} (we ird) name){rest}")
    age = process_age(odd)
    assert age is not None and age > 0


def test_no_answer_where_the_record_cannot_be_read(tmp_path: Path) -> None:
    assert process_age(tmp_path / "missing") is None
    garbled = tmp_path / "stat"
    garbled.write_text("12 (x) S 1 2")
    assert process_age(garbled) is None
