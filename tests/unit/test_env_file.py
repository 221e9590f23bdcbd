"""``read_env_file`` (``flexinfer render --env-file``): python-dotenv's grammar, strict about bad lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer.settings import read_env_file


def test_dotenv_quoting_export_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "controller.env"
    path.write_text("# controller defaults\n\n"
                    "export DEFAULT_FLASH_LOADER_IMAGE=\"reg/fl:7\"  # pinned\n"
                    "DEFAULT_SHM_SIZE_LIMIT=2Gi # trailing comment\n"
                    "HASH='a#b'\n"
                    "ESCAPED=\"say \\\"hi\\\"\"\n"
                    "EMPTY=\n"
                    "LITERAL=${HOME}\n", encoding="utf-8")
    assert read_env_file(path) == {"DEFAULT_FLASH_LOADER_IMAGE": "reg/fl:7", "DEFAULT_SHM_SIZE_LIMIT": "2Gi",
                                   "HASH": "a#b", "ESCAPED": 'say "hi"', "EMPTY": "", "LITERAL": "${HOME}"}


@pytest.mark.parametrize(("content", "line"), [("A=1\nNOT A PAIR\n", 2), ("A=1\n\nJUST_A_NAME\n", 3),
                                               ("  =value\n", 1)])
def test_a_line_that_is_not_key_value_names_its_line(tmp_path: Path, content: str, line: int) -> None:
    path = tmp_path / "bad.env"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=f"{path}:{line}: expected KEY=VALUE"):
        read_env_file(path)
