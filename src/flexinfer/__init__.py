"""FlexInfer: an inference control plane for on-prem GPUs.

Declarative ``Model`` resources become running model servers that time-share GPUs, behind an
OpenAI-compatible proxy. See ``docs/`` and the architecture note for the layer rules.
"""

__version__ = "0.1.0"
