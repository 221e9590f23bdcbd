"""The scope a symlink in the source may resolve into (``flexinfer.flashloader.link_scope``): which folder is
a Hugging Face repository, what the scope admits, and how a refusal reads."""

from __future__ import annotations

import pytest

from flexinfer.flashloader.link_scope import LinkScope, hf_repo_folder


@pytest.mark.parametrize(("root", "repo"), [
    ("/hub/models--org--m/snapshots/abc", "/hub/models--org--m"),
    ("/hub/models--org--m/snapshots/abc/tokenizer", "/hub/models--org--m"),
    ("/hub/models--org--m", "/hub/models--org--m"),
    ("/cache/datasets--org--d/snapshots/r", "/cache/datasets--org--d"),
    ("/hub/models--a--b/x/models--c--d/snapshots/r", "/hub/models--a--b/x/models--c--d"),
    ("/hub", None), ("/models/llama", None), ("/", None),
])
def test_which_folder_is_the_hugging_face_repository(root: str, repo: str | None) -> None:
    assert hf_repo_folder(root) == repo


def test_the_scope_admits_the_root_and_the_repository_folder_only() -> None:
    scope = LinkScope.of("/hub/models--org--m/snapshots/abc")
    assert scope.allows("/hub/models--org--m/snapshots/abc/config.json")
    assert scope.allows("/hub/models--org--m/blobs/1234")
    assert not scope.allows("/hub/models--org--m2/blobs/1234")
    assert not scope.allows("/hub/models--org--other/blobs/1234")
    assert not scope.allows("/etc/passwd")
    assert scope.refusal("../x") == ("symlink to ../x outside the source root and its Hugging Face repository "
                                     "folder /hub/models--org--m (not followed)")


def test_outside_a_repository_the_scope_is_the_root() -> None:
    scope = LinkScope.of("/models/llama")
    assert scope.repo is None
    assert scope.allows("/models/llama/blobs/1") and not scope.allows("/models/other/1")
    assert scope.refusal("/etc/passwd") == "symlink to /etc/passwd outside the source root (not followed)"
