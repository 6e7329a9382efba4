"""A deployment read without running a model: its target and draft configs and its server flags.

* ``check``: the taps the draft was trained on against what stock SGLang 0.5.23 and this project's plugin capture,
  the configs' inconsistencies and the server-flag traps, each with a fix (``doctor check``'s report; the demo runs
  it too). What each training pipeline makes of a config's ids is the engine-free ``eagle3_capture.pipelines``
  (the training-data fingerprint uses it too); SGLang's flag rules are ``sglang_model``'s.
"""
