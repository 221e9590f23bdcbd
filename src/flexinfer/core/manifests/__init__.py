"""The Kubernetes objects a Model becomes, rendered as plain dicts (no I/O).

``render`` (entry point: a Model and its settings → Deployment + Service), ``deployment`` (pod template,
probes, runtime profile), ``volumes`` (weights, ``/dev/shm``, flash-loader staging), ``cleanup`` (what a
deleted Model leaves to remove), ``group_pod`` (a shared group's one pod running ``flexinfer serve`` over its
members: ConfigMap, Deployment, Service) and ``group_members`` (who may join it, where their weights are mounted).
"""
