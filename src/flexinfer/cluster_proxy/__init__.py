"""The in-cluster proxy's Kubernetes half: what ``flexinfer proxy`` reads from and writes to the cluster.

``model_api`` (the API slice it uses) feeds ``model_watch`` (a list + watch cache of Models), which answers the
``catalog`` and, through ``dispatch_sync``, the proxy's dispatcher; ``demand`` turns the dispatcher's requests
into demand for the manager, reported in this replica's ``ModelDemand`` objects (``demand_report``,
``inflight_report``, ``wait_marker``); ``demand_activator`` is the proxy's way in (admission, in-flight reports).
It never imports the manager (``flexinfer.manager``); ``flexinfer.assembly.cluster_proxy`` wires it to the proxy.
"""
