"""Test support code shared by integration tests: real-component testbeds (kube-apiserver, Prometheus).

Importable as ``support`` because pytest's ``pythonpath`` includes ``tests``.
"""
