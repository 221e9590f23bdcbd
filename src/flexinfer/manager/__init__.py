"""``flexinfer manager``: the Kubernetes engine's controller program.

kopf watches (``operator``) fill the ``store``; the ``queue`` runs one ``reconciler`` pass per unit (an exclusive
Model or a shared group); the ``applier`` and ``client`` write through the API server; ``leader`` holds the
election Lease; ``lifecycle`` turns status transitions into lifecycle facts; ``program`` runs it all. It never
imports the proxy's cluster half (``flexinfer.cluster_proxy``): the two programs meet only through stored
objects (Model status, ``ModelDemand`` reports).
"""
