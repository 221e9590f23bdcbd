"""Pure planning rules: exclusion, fp16 variant, incremental decisions, headroom, range splitting, escapes."""

from __future__ import annotations

import itertools
import posixpath

from hypothesis import given
from hypothesis import strategies as st

from flexinfer.flashloader.plan import (
    HEADROOM_MIN,
    DestListing,
    SourceFile,
    apply_variant,
    build_plan,
    demote,
    is_excluded,
    is_safe_relative,
    required_space,
    split_ranges,
)

DEFAULTS = (".cache/", ".git/")


def test_exclusion_prefix_on_relative_path_or_name() -> None:
    assert is_excluded(".cache", ".cache", True, DEFAULTS)
    assert is_excluded("sub/.git", ".git", True, DEFAULTS)
    assert not is_excluded(".gitattributes", ".gitattributes", False, DEFAULTS)
    assert not is_excluded(".cachex", ".cachex", True, DEFAULTS)
    assert is_excluded("originals/x.bin", "x.bin", False, ("originals/",))
    assert is_excluded("sub/onnx_model.bin", "onnx_model.bin", False, ("onnx",))
    assert not is_excluded("model.bin", "model.bin", False, ("onnx",))


def files(*rels: str, size: int = 1) -> list[SourceFile]:
    return [SourceFile(rel, size) for rel in rels]


def test_fp16_variant_drops_shadowed_full_precision() -> None:
    given_files = files("model.safetensors", "model.fp16.safetensors", "other.safetensors", "sub/a.safetensors",
                        "sub/a.fp16.safetensors", "a.safetensors")
    kept = {item.rel for item in apply_variant(given_files, "fp16")}
    assert kept == {"model.fp16.safetensors", "other.safetensors", "sub/a.fp16.safetensors", "a.safetensors"}
    assert len(apply_variant(given_files, None)) == len(given_files)


def test_plan_skips_same_size_and_creates_missing_dirs() -> None:
    dest = DestListing(sizes={"same.bin": 5, "grown.bin": 3}, dirs={"a"})
    plan = build_plan([SourceFile("same.bin", 5), SourceFile("grown.bin", 4), SourceFile("a/b/c.bin", 2)], dest)
    assert [item.rel for item in plan.unchanged] == ["same.bin"]
    assert [item.rel for item in plan.copies] == ["grown.bin", "a/b/c.bin"]
    assert plan.new_dirs == ("a/b",)
    assert plan.bytes_to_copy == 6


def test_demote_moves_changed_files_to_copies() -> None:
    item = SourceFile("x.bin", 5)
    plan = build_plan([item], DestListing(sizes={"x.bin": 5}))
    moved = demote(plan, [item])
    assert moved.copies == (item,) and moved.unchanged == ()


def test_headroom_is_max_of_five_percent_and_ten_mib() -> None:
    assert required_space(0) == HEADROOM_MIN
    assert required_space(100 * 2**20) == 110 * 2**20
    assert required_space(1000 * 2**20) == 1050 * 2**20


@given(st.integers(min_value=1, max_value=2**34), st.integers(min_value=0, max_value=200))
def test_ranges_cover_the_file_exactly(chunk: int, extra: int) -> None:
    size = chunk * (extra // 10) + extra
    ranges = split_ranges(size, chunk)
    assert ranges[0][0] == 0 and ranges[-1][0] + ranges[-1][1] == size
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(ranges))
    assert all(0 < length <= chunk for _, length in ranges) or size == 0


@given(st.lists(st.sampled_from(["..", ".", "", "a", "b.bin", "/", "\\", "x\0"]), min_size=1, max_size=5))
def test_planned_paths_never_escape_the_root(parts: list[str]) -> None:
    rel = "/".join(parts)
    plan = build_plan([SourceFile(rel, 1)], DestListing())
    for item in plan.copies:
        joined = posixpath.normpath(posixpath.join("/dst", item.rel))
        assert joined.startswith("/dst/") and ".." not in item.rel.split("/")
    assert bool(plan.copies) == is_safe_relative(rel)
    assert len(plan.copies) + len(plan.rejected) == 1
