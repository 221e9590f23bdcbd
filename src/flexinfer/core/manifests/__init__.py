"""The Kubernetes objects a Model becomes, rendered as plain dicts (no I/O).

``render`` (entry point: a Model and its settings → Deployment + Service), ``deployment`` (pod template,
probes, runtime profile), ``volumes`` (weights, ``/dev/shm``, flash-loader staging), ``cleanup`` (what a
deleted Model leaves to remove).
"""
