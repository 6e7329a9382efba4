"""A deployment read without running a model: its target and draft configs and its server flags (``doctor check``;
the demo runs it too).

* ``run``: :class:`~.run.CheckRequest` (the command's flags, one field each) -> :func:`~.run.run_check` -> the
  report;
* ``config_findings``: the configs read, their inconsistencies, the training pipelines' disagreement over the ids
  (the engine-free ``eagle3_capture.pipelines``), the draft checkpoint's fc against K*H;
* ``engines``: what stock SGLang (the release modelled and every other), stock vLLM and this project's plugin
  capture from the draft's ids;
* ``report``: the report, as text and as JSON.

SGLang's flag rules are ``sglang_model``'s; the fingerprint is ``fingerprint``'s.
"""
