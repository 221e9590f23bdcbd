"""A Model's status in the Kubernetes engine, computed without I/O.

``build`` derives phase, conditions and the status document from observed facts; ``plan`` decides, for one
reconcile unit, what each member's Deployment and status should become.
"""
