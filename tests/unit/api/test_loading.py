"""Loading manifests: multi-document YAML, directories, and problems named by file, document and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer.api import InvalidResourceError, Model, ModelCache, load_paths, parse_documents, parse_resource
from flexinfer.api.gpulease import GPULease
from flexinfer.api.loading import load_manifest_text, load_manifest_texts, read_manifest_files

MODEL = """\
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {name: %s}
spec: {backend: llama.cpp, source: "HF://org/%s"}
"""
CACHE = """\
apiVersion: ai.flexinfer/v1alpha1
kind: ModelCache
metadata: {name: c1, namespace: team}
spec: {source: "HF://org/a", flashLoader: {enabled: true, concurrency: 8}}
"""
LEASE = """\
apiVersion: ai.flexinfer/v1alpha2
kind: GPULease
metadata: {name: l1}
spec: {group: gfx1100-0, expiresAt: "2030-01-01T00:00:00Z"}
"""


def problems_of(text: str, source: str = "f.yaml") -> list[str]:
    with pytest.raises(InvalidResourceError) as info:
        parse_documents(text, source)
    return [str(p) for p in info.value.problems]


def test_multi_document_text_yields_each_kind_in_order() -> None:
    resources = parse_documents("\n---\n".join([MODEL % ("a", "a"), CACHE, LEASE, ""]))
    assert [type(r) for r in resources] == [Model, ModelCache, GPULease]
    model, cache, _ = resources
    assert isinstance(model, Model) and model.backend == "llamacpp" and model.namespace == "default"
    assert isinstance(cache, ModelCache) and cache.spec.flash_loader and cache.spec.flash_loader.concurrency == 8


def test_directory_is_read_recursively_and_sorted(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.yaml").write_text(MODEL % ("b", "b"))
    (tmp_path / "sub" / "a.yml").write_text(MODEL % ("a", "a"))
    (tmp_path / "notes.txt").write_text("not a manifest")
    names = [r.metadata.name for r in load_paths([tmp_path])]
    assert names == ["b", "a"]


def test_problems_name_file_document_and_field_path() -> None:
    text = MODEL % ("ok", "ok") + "---\n" + """\
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {name: bad}
spec:
  backend: vllm
  source: HF://org/x
  gpu: {priority: 5000, colour: red}
"""
    assert problems_of(text) == [
        "f.yaml:12:9: spec.gpu.priority: must be ≤ 1000, got 5000",
        "f.yaml:12:25: spec.gpu.colour: unknown field",
    ]


def test_unknown_kind_names_kind_and_apiversion() -> None:
    [problem] = problems_of("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n")
    assert problem == ("f.yaml:2:1: kind: Pod (v1) is not a FlexInfer kind (--skip-unknown-kinds leaves out objects "
                       "of other kinds)")


def test_known_kind_with_wrong_version_is_unknown() -> None:
    [problem] = problems_of((MODEL % ("a", "a")).replace("v1alpha2", "v1alpha1"))
    assert "unknown kind 'Model' in apiVersion 'ai.flexinfer/v1alpha1'" in problem


def test_every_document_is_checked_before_raising() -> None:
    text = "apiVersion: v1\nkind: Pod\n---\n- a list\n---\n" + (MODEL % ("x", "x")).replace("llama.cpp", "tgi")
    problems = problems_of(text)
    assert [p.split(":")[0] for p in problems] == ["f.yaml", "f.yaml", "f.yaml"]
    assert "document is not a mapping" in problems[1]
    assert "spec.backend: must be one of" in problems[2] and "'tgi'" in problems[2]


def test_invalid_yaml_is_one_line_with_position() -> None:
    [problem] = problems_of(MODEL % ("a", "a") + "---\nspec: [unclosed\n")
    assert "\n" not in problem
    assert problem == "f.yaml:7:1: invalid YAML: expected ',' or ']', but got '<stream end>'"


def test_missing_required_fields_are_named() -> None:
    problems = problems_of("apiVersion: ai.flexinfer/v1alpha2\nkind: Model\nmetadata: {name: a}\nspec: {}\n")
    assert problems == [
        "f.yaml:4:1: spec.backend: required field is missing",
        "f.yaml:4:1: spec.source: required field is missing",
    ]


def test_dotted_map_keys_are_bracketed_in_paths() -> None:
    text = (MODEL % ("a", "a")).replace('"}', '", resources: {limits: {example.com/x: 2Zi}}}')
    [problem] = problems_of(text)
    assert problem.startswith("f.yaml:4:71: spec.resources.limits[example.com/x]: invalid quantity '2Zi'")


def test_missing_path_is_a_problem_not_a_traceback(tmp_path: Path) -> None:
    with pytest.raises(InvalidResourceError) as info:
        load_paths([tmp_path / "nope.yaml"])
    assert str(info.value.problems[0]) == f"{tmp_path / 'nope.yaml'}: no such file or directory"


def test_duplicate_resources_across_files_are_reported(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(MODEL % ("same", "a"))
    (tmp_path / "b.yaml").write_text(MODEL % ("same", "b"))
    with pytest.raises(InvalidResourceError, match="duplicate Model default/same"):
        load_paths([tmp_path])


def test_parse_resource_rejects_non_mapping_with_index() -> None:
    with pytest.raises(InvalidResourceError) as info:
        parse_resource(["x"], "watch", 3)
    assert str(info.value.problems[0]) == "watch[doc 3]: document is not a mapping"


def test_numbers_given_for_quantities_are_kept_as_text() -> None:
    [model] = parse_documents((MODEL % ("a", "a")).replace('"}', '", resources: {requests: {cpu: 2}}}'))
    assert isinstance(model, Model) and model.spec.resources and model.spec.resources.requests == {"cpu": "2"}


def test_a_pushed_text_is_checked_like_a_file_and_located_by_its_source_name(tmp_path: Path) -> None:
    """``load_manifest_text`` and the files share one path: the same problems, named ``pushed:line:column``
    (a duplicate too); JSON is a manifest text too."""
    text = "---\n".join([MODEL % ("a", "a"), MODEL % ("a", "b"), (MODEL % ("c", "c")).replace("llama.cpp", "nope")])
    (tmp_path / "m.yaml").write_text(text)
    with pytest.raises(InvalidResourceError) as from_file:
        load_paths([tmp_path / "m.yaml"])
    with pytest.raises(InvalidResourceError) as pushed:
        load_manifest_text(text.encode(), "pushed")
    file_problems = [str(p).replace(str(tmp_path / "m.yaml"), "pushed") for p in from_file.value.problems]
    assert [str(p) for p in pushed.value.problems] == file_problems
    assert file_problems[0].startswith("pushed:14:8: spec.backend: must be one of ")
    with pytest.raises(InvalidResourceError) as twice:
        load_manifest_text("---\n".join([MODEL % ("a", "a"), MODEL % ("a", "b")]).encode(), "pushed")
    assert [str(p) for p in twice.value.problems] == [
        "pushed:8:12: metadata.name: duplicate Model default/a (first defined at pushed:3:12)"]
    as_json = b'{"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": "j"},\n' \
              b' "spec": {"backend": "llama.cpp", "source": "HF://org/j", "gpu": {"priority": 5000}}}'
    with pytest.raises(InvalidResourceError) as json_problem:
        load_manifest_text(as_json, "pushed")
    assert str(json_problem.value.problems[0]).startswith("pushed:2:67: spec.gpu.priority: must be ≤ 1000")
    assert [m.resource.name for m in load_manifest_text(as_json.replace(b"5000", b"5"), "pushed")] == ["j"]


def test_undecodable_bytes_are_a_problem_naming_the_source(tmp_path: Path) -> None:
    with pytest.raises(InvalidResourceError) as info:
        load_manifest_text(b"kind: \xff\n", "pushed")
    assert str(info.value.problems[0]).startswith("pushed: cannot read: 'utf-8' codec can't decode byte 0xff")
    (tmp_path / "bad.yaml").write_bytes(b"kind: \xff\n")
    (tmp_path / "ok.yaml").write_text(MODEL % ("a", "a"))
    texts = read_manifest_files([tmp_path])
    assert [(Path(t.source).name, t.data[:4]) for t in texts] == [("bad.yaml", b"kind"), ("ok.yaml", b"apiV")]
    with pytest.raises(InvalidResourceError, match=r"bad\.yaml: cannot read"):
        load_manifest_texts(texts)
