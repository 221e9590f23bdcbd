"""Reference cycles a piece of code leaves behind, for the tests that keep a long-running server's memory flat.

``serve`` and ``proxy`` run with the cyclic garbage collector nearly off (``flexinfer.assembly.event_loop``:
a young collection every 50,000 net allocations), so an object that only a reference cycle keeps alive stays
in memory for many minutes of a swap storm, and what it holds with it (a transport, a parser) too. Objects
freed by reference counting are gone at once.

    with unreachable_cycles() as cycles:     # the code under test, the collector off
        ...
        await eventually(lambda: instances(FrontConnection) == 0)
    assert not kinds(cycles) & {"Connection"}

On exit ``cycles`` holds the objects that became unreachable inside the block but were still in memory: the
members of reference cycles (and what they alone kept alive). ``instances`` counts the objects of a class still
in memory (inside the block, those of cycles included).
"""

from __future__ import annotations

import contextlib
import gc
import types
from collections.abc import Iterable, Iterator


@contextlib.contextmanager
def unreachable_cycles() -> Iterator[list[object]]:
    """Run the block with the cyclic collector off; then list what only reference cycles kept alive."""
    cycles: list[object] = []
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield cycles
    finally:
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            gc.collect()
            cycles.extend(gc.garbage)
            gc.garbage.clear()
        finally:
            gc.set_debug(0)
            if enabled:
                gc.enable()


def instances(cls: type) -> int:
    """Objects of ``cls`` in memory (tracked by the collector: instances of classes with references)."""
    return sum(isinstance(obj, cls) for obj in gc.get_objects())


def kinds(objects: Iterable[object]) -> set[str]:
    """The qualified names of the objects' types; a function is ``function:MODULE.QUALNAME``."""
    return {f"function:{obj.__module__}.{obj.__qualname__}" if isinstance(obj, types.FunctionType)
            else type(obj).__qualname__ for obj in objects}
