"""What a vLLM server tells the doctor (pure Python): its speculative-decoding counters on ``/metrics``, and the same
counters predicted from the doctor's replay of the served loop."""
from .counters import SpecCounters, parse_spec_counters, predicted_counters

__all__ = ["SpecCounters", "parse_spec_counters", "predicted_counters"]
