"""The ``model`` field of a ``multipart/form-data`` body (OpenAI's audio transcription and image edit calls).

Spec §6.3 step 4: when neither the ``X-Model-ID`` header nor a ``/model/<name>/`` prefix names the model,
a form body's ``model`` field does, and the body is forwarded unchanged. python-multipart's streaming parser
scans the buffered body once; only part headers and the ``model`` part's bytes are kept, so a large audio
upload is not copied. Called by ``routing.py``.
"""

from __future__ import annotations

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from flexinfer.core.errors import BadRequestError

FORM_TYPE = b"multipart/form-data"
MAX_FIELD_BYTES = 1024
"""A model name longer than this is a client error, not something to buffer."""


def form_boundary(content_type: str) -> bytes | None:
    """The boundary of a ``multipart/form-data`` content type; ``None`` for any other type."""
    if content_type.lstrip()[:10].lower() != "multipart/":
        return None  # not a form (a JSON body): no header parse
    mime, options = parse_options_header(content_type)
    if mime.lower() != FORM_TYPE:
        return None
    return options.get(b"boundary") or None


def form_field(boundary: bytes, body: bytes, name: str = "model") -> str | None:
    """The text of the first form field called ``name`` (stripped), ``None`` when the form has none.

    A malformed form, an oversized or non-UTF-8 value is a ``BadRequestError`` naming the problem.
    """
    scan = _FieldScan(name.encode())
    parser = MultipartParser(boundary, {
        "on_part_begin": scan.part_begin, "on_header_field": scan.header_field,
        "on_header_value": scan.header_value, "on_header_end": scan.header_end,
        "on_part_data": scan.part_data, "on_part_end": scan.part_end,
    })
    try:
        parser.write(body)
        parser.finalize()
    except MultipartParseError as exc:
        raise BadRequestError(f"multipart/form-data body is malformed: {exc}", param=name) from None
    if scan.value is None:
        return None
    try:
        text = scan.value.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise BadRequestError(f"form field `{name}` is not UTF-8 text", param=name) from None
    return text or None


class _FieldScan:
    """Parser callbacks that remember each part's name and collect the wanted part's bytes."""

    def __init__(self, wanted: bytes) -> None:
        self.wanted = wanted
        self.value: bytes | None = None
        self._part_name: bytes | None = None
        self._field, self._header = bytearray(), bytearray()
        self._data = bytearray()

    @property
    def _collecting(self) -> bool:
        return self.value is None and self._part_name == self.wanted

    def part_begin(self) -> None:
        self._part_name = None
        self._data.clear()

    def header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def header_value(self, data: bytes, start: int, end: int) -> None:
        self._header += data[start:end]

    def header_end(self) -> None:
        if bytes(self._field).lower() == b"content-disposition":
            _, options = parse_options_header(bytes(self._header))
            self._part_name = options.get(b"name")
        self._field.clear()
        self._header.clear()

    def part_data(self, data: bytes, start: int, end: int) -> None:
        if not self._collecting:
            return
        self._data += data[start:end]
        if len(self._data) > MAX_FIELD_BYTES:
            raise BadRequestError(f"form field `{self.wanted.decode()}` is longer than {MAX_FIELD_BYTES} bytes",
                                  param=self.wanted.decode())

    def part_end(self) -> None:
        if self._collecting:
            self.value = bytes(self._data)
