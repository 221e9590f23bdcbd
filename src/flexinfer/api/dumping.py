"""Resources as YAML text that FlexInfer writes for another FlexInfer program to load (``flexinfer.api.loading``
reads it back).

``dump_documents`` is deterministic: the same documents give byte-identical text (keys sorted, no anchors or
aliases, no line folding), so the text's digest names the configuration. Used by the group pod's manifests
(``flexinfer.core.manifests.group_pod``: the ``flexinfer serve`` input the manager hands the pod).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

UNFOLDED = 1 << 16
"""Line width large enough that no value is folded over lines."""


class _PlainDumper(yaml.SafeDumper):
    """A safe dumper that writes a repeated object out again instead of as an alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_documents(docs: Sequence[Mapping[str, Any]]) -> str:
    """A ``---``-separated YAML stream of ``docs`` (plain JSON-like values), keys sorted; ``""`` for none."""
    if not docs:
        return ""
    return yaml.dump_all([dict(doc) for doc in docs], Dumper=_PlainDumper, sort_keys=True, explicit_start=True,
                         default_flow_style=False, allow_unicode=True, width=UNFOLDED)
