"""The local engine: model servers as child processes on one machine (``flexinfer serve``).

``engine.LocalEngine`` implements ``flexinfer.runtime.ports.Engine``; it is built from ``profiles`` (backend
launch commands as data), ``sources`` (``file://`` weights and their tmpfs staging layout), ``ports``,
``process`` (process-group supervision), ``readiness`` (health probing), ``logs`` (captured output) and
``gpu_discovery``. ``catalog`` and ``admin`` are the proxy catalog and the admin API of ``serve``;
``config`` parses its settings and ``validation`` its start-up notes. Wired by ``flexinfer.assembly``.
"""
