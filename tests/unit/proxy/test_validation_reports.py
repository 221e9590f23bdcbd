"""Request-validation reports in model servers' error messages: recognised in FastAPI's and pydantic's formats
(as llama.cpp's Python server sends them), summarised without the echoed input; anything else is not one."""

from __future__ import annotations

import pytest

from flexinfer.proxy.validation_reports import MAX_ITEMS, Report, request_report

WRONG_TYPE = """1 validation error:
  {'type': 'int_parsing', 'loc': ('body', 'max_tokens'), 'msg': 'Input should be a valid integer, unable to parse \
string as an integer', 'input': 'lots'}

  File "/srv/venv/lib/python3.11/site-packages/llama_cpp/server/app.py", line 376, in create_chat_completion
    POST /v1/chat/completions"""
TEXT_PLAIN = """1 validation error:
  {'type': 'model_attributes_type', 'loc': ('body',), 'msg': 'Input should be a valid dictionary or object to \
extract fields from', 'input': b'{"model":"m","messages":[{"role":"user","content":"a secret prompt"}]}'}"""
TWO = """2 validation errors:
  {'type': 'greater_than_equal', 'loc': ('body', 'max_tokens'), 'msg': 'Input should be greater than or equal \
to 0', 'input': -5, 'ctx': {'ge': 0}}
  {'type': 'value_error', 'loc': ('body', 'messages', 0, 'content'), 'msg': "Value error, can't be 'x'", \
'input': 'x', 'ctx': {'error': ValueError("can't")}}"""
PYDANTIC = """1 validation error for CreateCompletionRequest
max_tokens
  Input should be greater than or equal to 0 [type=greater_than_equal, input_value=-5, input_type=int]
    For further information visit https://errors.pydantic.dev/2.13/v/greater_than_equal"""


@pytest.mark.parametrize(("message", "expected"), [
    (WRONG_TYPE, Report("max_tokens: Input should be a valid integer, unable to parse string as an integer",
                        "max_tokens")),
    (TEXT_PLAIN, Report("body: Input should be a valid dictionary or object to extract fields from", None)),
    (TWO, Report("max_tokens: Input should be greater than or equal to 0; messages.0.content: Value error, "
                 "can't be 'x'", None)),
    (PYDANTIC, Report("max_tokens: Input should be greater than or equal to 0", "max_tokens")),
])
def test_request_validation_reports_are_summarised_without_the_input(message: str, expected: Report) -> None:
    assert request_report(message) == expected


@pytest.mark.parametrize("message", [
    "1 validation error:\n  {'type': 'missing', 'loc': ('response', 'id'), 'msg': 'Field required', 'input': {}}",
    "1 validation error for ChatCompletion\nid\n  Field required [type=missing, input_value={}, input_type=dict]",
    "'utf-8' codec can't encode character '\\ud800' in position 7: surrogates not allowed",
    "RuntimeError: kv cache exhausted", "", "3 validation errors:\n",
])
def test_other_messages_are_not_request_reports(message: str) -> None:
    """A server's invalid *response* and its own failures stay server errors."""
    assert request_report(message) is None


def test_a_long_report_is_cut_to_a_few_items() -> None:
    items = "\n".join(f"  {{'type': 'missing', 'loc': ('body', 'f{n}'), 'msg': 'Field required'}}" for n in range(9))
    report = request_report(f"9 validation errors:\n{items}")
    assert report is not None and report.summary.count("Field required") == MAX_ITEMS
    assert report.summary.endswith(f"; and {9 - MAX_ITEMS} more")
