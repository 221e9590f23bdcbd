"""The Kubernetes engine: kopf handlers, API client and status writer (``flexinfer manager``)."""
