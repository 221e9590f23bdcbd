"""Composition roots: the only package that wires adapters together.

``local.run_local`` (``flexinfer serve``), ``manager.run_manager`` (``flexinfer manager``), ``proxy.run_proxy``
(``flexinfer proxy``) and ``reference`` (the configuration reference behind ``flexinfer settings``). The CLI
calls these; integration tests call them too. Each module imports only what its command needs.
"""
