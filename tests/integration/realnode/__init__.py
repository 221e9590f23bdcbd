"""The operator's journey on a real one-node cluster (hack/kube-node); see docs/testing.md."""
