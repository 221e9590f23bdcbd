"""The model reference covers every field and config key and docs/reference/models.md is its current output;
the admin API reference names every admin and status page route."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flexinfer.assembly.model_reference import CACHE_ENGINES, CONFIG_KEYS, ENGINES, cache_rows, model_rows
from flexinfer.cli.main import main
from flexinfer.local.admin import AdminApi
from flexinfer.proxy.status_page import StatusPage

ROOT = Path(__file__).resolve().parents[3]
CONFIG_READ = re.compile(r"""spec\.config\.get\(\s*["'](\w+)["']""")


def test_models_doc_is_the_generated_reference(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["settings", "--models"]) == 0
    generated = capsys.readouterr().out
    committed = (ROOT / "docs" / "reference" / "models.md").read_text(encoding="utf-8")
    assert committed == generated, (
        "docs/reference/models.md is stale: run `flexinfer settings --models > docs/reference/models.md`")


def test_every_field_has_a_description_and_an_engine() -> None:
    rows = model_rows() + cache_rows()
    assert [r.path for r in rows if not r.meaning] == []
    assert {r.engines for r in rows} <= {"both", "local", "kubernetes", "none"}


def test_engine_tables_name_only_real_fields() -> None:
    assert set(ENGINES) - {r.path for r in model_rows()} == set()
    assert set(CACHE_ENGINES) - {r.path for r in cache_rows()} == set()


def test_every_config_key_the_code_reads_is_documented() -> None:
    read: set[str] = set()
    for path in (ROOT / "src" / "flexinfer").rglob("*.py"):
        read |= set(CONFIG_READ.findall(path.read_text(encoding="utf-8")))
    assert {"command", "healthPath", "servedModelName"} <= read, "the scan missed known keys"
    assert read - {k.key for k in CONFIG_KEYS} == set()


def test_the_reference_explains_command_placeholders_and_both_served_names() -> None:
    text = (ROOT / "docs" / "reference" / "models.md").read_text(encoding="utf-8")
    for needle in ("`{port}`", "`{model_path}`", "`healthPath`", "`args`", "`env`", "## Two served model names",
                   "`spec.litellm.servedModelName`", "`spec.config.servedModelName`"):
        assert needle in text, needle


def test_admin_api_doc_names_every_route() -> None:
    text = (ROOT / "docs" / "reference" / "admin-api.md").read_text(encoding="utf-8")
    admin = AdminApi.routes(AdminApi(None, None, None, lambda _: None))  # type: ignore[arg-type]
    page = StatusPage.routes(StatusPage(list, None, None, "local"))  # type: ignore[arg-type]
    for route in [*admin, *page]:
        path = re.sub(r"\{(\w+):[^}]*\}", r"{\1}", route.path)  # type: ignore[attr-defined]
        assert f"{route.method} {path}" in text, f"{route.method} {path}"  # type: ignore[attr-defined]
