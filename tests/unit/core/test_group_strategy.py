"""``FLEXINFER_GROUP_STRATEGIES`` (``flexinfer.core.group_strategy``): which shared groups run in a group pod."""

from __future__ import annotations

import pytest

from flexinfer.core.errors import ConfigError
from flexinfer.core.group_strategy import parse_group_strategies, runs_in_group_pod, strategy_of


def test_entries_parse_case_blind_and_a_namespaced_entry_wins() -> None:
    pairs = parse_group_strategies(" gpu0=timesliced, team-a/gpu0=Exclusive ,gpu1=MemoryShared,")
    assert dict(pairs) == {"gpu0": "TimeSliced", "team-a/gpu0": "Exclusive", "gpu1": "MemoryShared"}
    assert strategy_of(pairs, "default", "gpu0") == "TimeSliced"
    assert strategy_of(pairs, "team-a", "gpu0") == "Exclusive"
    assert strategy_of(pairs, "default", "other") == "Exclusive"
    assert runs_in_group_pod(pairs, "default", "gpu1") and not runs_in_group_pod(pairs, "team-a", "gpu0")
    assert not runs_in_group_pod(pairs, "default", None)
    assert parse_group_strategies("") == ()


@pytest.mark.parametrize(("text", "names"), [
    ("gpu0", "expected GROUP=STRATEGY"),
    ("gpu0=Shared", "gpu0: unknown strategy 'Shared'; expected one of Exclusive, TimeSliced, MemoryShared"),
    ("GPU0=TimeSliced", "got 'GPU0=TimeSliced'"),
    ("a/b/c=TimeSliced", "got 'a/b/c=TimeSliced'"),
])
def test_a_bad_entry_is_a_config_error_naming_the_variable_and_the_entry(text: str, names: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_group_strategies(text)
    assert str(caught.value).startswith("FLEXINFER_GROUP_STRATEGIES: ") and names in str(caught.value)
