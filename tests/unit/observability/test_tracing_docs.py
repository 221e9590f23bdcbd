"""docs/tracing.md's span table names exactly the spans the code emits (it once listed a
``modelcache.reconcile`` span that nothing emitted, and missed ``/v1/models``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "src" / "flexinfer"
SPAN_LITERAL = re.compile(r"""["'](proxy\.[a-z_]+|model\.activation)["']""")
RECONCILE_SCOPE = re.compile(r"""_scope\(\s*["']([a-z]+)["']""")


def documented_spans() -> set[str]:
    text = (ROOT / "docs" / "tracing.md").read_text(encoding="utf-8")
    table = text.split("## Spans", 1)[1].split("\n\n", 2)[1]
    return {match.group(1) for line in table.splitlines() if (match := re.match(r"\| `([^`]+)`", line))}


def emitted_spans() -> set[str]:
    names: set[str] = {"activation.<stage>"}  # f"activation.{stage}" in observability/tracing/lifecycle.py
    for path in SRC.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        names |= set(SPAN_LITERAL.findall(text))
        names |= {f"{controller}.reconcile" for controller in RECONCILE_SCOPE.findall(text)}
    return names


def test_span_table_matches_the_code() -> None:
    assert documented_spans() == emitted_spans()
