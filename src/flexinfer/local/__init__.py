"""The local engine: model servers as child processes on one machine (``flexinfer serve``)."""
