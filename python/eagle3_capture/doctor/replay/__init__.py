"""The draft replayed offline over a target side, and the figures that come out of it.

* ``evaluate``: at every anchor of each prompt's continuation, the draft's chain (teacher-forced correctness per
  step) and what SGLang's verify there accepts for the server's flags (chain, or tree for eagle-topk > 1);
* ``metrics``: top-1 accuracy per draft step (teacher-forced and conditional) and tau; what the served accept
  length and tau mean.
"""
