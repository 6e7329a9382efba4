"""Acceptance while serving: what the plugin counts per draft position, what the draft should get (the expected
profile that ``doctor accept`` / ``doctor online`` write), and the sequential test that says when live acceptance
has fallen below it by more than chance allows.

- names.py: the Prometheus metrics the plugin exports (names, labels, help), shared by the plugin, the rules in
  ``monitoring/`` and ``doctor watch``.
- profile.py: the expected-acceptance profile file (its one owner: write, read, validate).
- positions.py: per-position attempts and acceptances from a histogram of correct drafts per verify.
- drift.py: the drift alarm (a one-sided Bernoulli CUSUM per position on blocks of verifies) and its false-alarm
  bound.

Pure Python: no torch, no SGLang, no prometheus_client.
"""
