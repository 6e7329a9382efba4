"""eagle3-capture: make EAGLE-3 speculative decoding capture exactly the hidden states its draft was trained on.

Modules, one concern each:
  spec        canonical taps (Embedding, LayerOutput(k)) and converters between conventions
  configs     reading target and draft config.json files
  ops         torch.ops.eagle3_capture.* wrappers and their fake (meta) implementations
  reference   plain-torch reference of every op (the test oracle, float64-capable)
  native      loading the compiled extension and describing the build
"""
from .native import build_info

__all__ = ["build_info"]
__version__ = "0.1.0"
