"""The arbiter: which model owns a GPU group, decided from events, with effects out (no I/O).

``events`` (what comes in and the effects that go out), ``policy`` (the knobs), ``state`` (per-model and
per-group bookkeeping), ``machine`` (the ``Arbiter`` that folds an event into state and effects).
"""
