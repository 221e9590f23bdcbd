"""Composition roots: the only module that wires adapters together (``run_local``, ``run_manager``,
``run_proxy``). The CLI calls these; integration tests call them too.
"""
