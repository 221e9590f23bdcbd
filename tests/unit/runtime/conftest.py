"""Fixtures for the runtime tests: a controllable clock and a recording engine."""

from __future__ import annotations

import pytest

from support.recording_engine import FakeClock, RecordingEngine


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def engine() -> RecordingEngine:
    return RecordingEngine()
