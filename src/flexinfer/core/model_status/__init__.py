"""A Model's status in the Kubernetes engine, computed without I/O.

``build`` derives phase, conditions and the status document from observed facts; ``plan`` decides one
member's replicas and status inputs. ``flexinfer.core.unit_plan`` plans a whole reconcile unit with both.
"""
