"""Generated request ids (``flexinfer.proxy.request_ids``) are canonical, distinct version-4 UUIDs, and the
proxy keeps one when a client sends it back."""

from __future__ import annotations

import uuid

from flexinfer.proxy.request_ids import REQUEST_ID_HEADER, new_request_id, request_id


def test_generated_ids_are_canonical_version_4_uuids() -> None:
    ids = [new_request_id() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    for value in ids[:2_000]:
        parsed = uuid.UUID(value)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, value)


def test_a_generated_id_sent_back_by_a_client_is_kept() -> None:
    value = new_request_id()
    assert request_id({REQUEST_ID_HEADER: value}).value == value
    assert request_id({}).value != value
