"""PLACEHOLDER, TO BE REPLACED AT MERGE by the metrics helper's exporter.py (worktree `metrics`): the plugin's
Prometheus metrics through SGLang's /metrics. Only the interface is here, so that the self-test (selftest.py) can
call it: every function does nothing and :func:`enabled` says False.

Interface (names from eagle3_capture.acceptance.names; the exporter adds ``model_name``):
``enabled() -> bool``, ``inc(name, labels, by=1)``, ``set_gauge(name, labels, value)``.
"""
from __future__ import annotations


def enabled() -> bool:
    """Whether metrics are exported in this process (placeholder: never)."""
    return False


def inc(name: str, labels: dict, by=1) -> None:
    """Add `by` to the counter `name` with `labels` (placeholder: nothing)."""


def set_gauge(name: str, labels: dict, value) -> None:
    """Set the gauge `name` with `labels` to `value` (placeholder: nothing)."""


__all__ = ["enabled", "inc", "set_gauge"]
