"""The plugin's Prometheus metrics, exported through SGLang's own ``/metrics`` (names and labels: acceptance/names.py).

SGLang with ``--enable-metrics`` sets ``PROMETHEUS_MULTIPROC_DIR`` before it starts its scheduler processes, and its
``/metrics`` reads every process's files with prometheus_client's ``MultiProcessCollector``, which sums counters
over processes and, for gauges, does what each gauge's ``multiprocess_mode`` says (``max`` here: the largest value
any live or dead process wrote). The metric objects are made here, in the scheduler process, lazily, and only when
the target's server args say ``enable_metrics``: they are not registered in any registry of this process (the
collector reads their files), so making them twice (tests) is harmless.

Interface (the acceptance flush and the self-test use it)::

    configure(server_args, tp_rank) -> str    # at the target's model load; returns a few words for the log line
    enabled() -> bool
    inc(name, labels, by=1)                   # a counter of names.COUNTERS
    set_gauge(name, labels, value)            # a gauge of names.GAUGES

``labels`` holds every label of the metric but ``model_name`` (added: the served model name, else the model path);
``tp_rank`` is added too when the metric has it and ``labels`` does not (the rank given to configure). A name or
labels that do not match names.py raise ValueError, metrics on or off (a caller's bug, found by its tests); with
metrics off both are no-ops otherwise. A failure of prometheus_client itself (its files cannot be written) never
reaches the caller: one ERROR line, and export is off in this process.
"""
from __future__ import annotations

import math
import os
import threading
from typing import Any, Dict, Mapping, Optional

from ...acceptance import names
from ..settings import switches

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
EXPORTED = "exported to SGLang's /metrics"

_lock = threading.Lock()      # making a metric object (the flush thread and the scheduler thread may race)
_metrics: Dict[str, Any] = {}
_enabled = False
_model = ""
_tp_rank: Optional[int] = None
_why_off = "not configured (the target model has not loaded)"


def configure(server_args, tp_rank) -> str:
    """Export or not, from the target's server args (``enable_metrics``, ``served_model_name`` / ``model_path``);
    returns a few words saying which, and why not."""
    global _enabled, _model, _tp_rank, _why_off
    with _lock:
        _metrics.clear()
        _model = str(getattr(server_args, "served_model_name", None) or getattr(server_args, "model_path", None)
                     or "")
        _tp_rank = None if tp_rank is None else int(tp_rank)
        _enabled = False
        if not getattr(server_args, "enable_metrics", False):
            _why_off = "not exported (--enable-metrics is off)"
        elif not os.environ.get(MULTIPROC_ENV):
            _why_off = (f"not exported: {MULTIPROC_ENV} is not set in this process, so SGLang's /metrics cannot "
                        "read what it counts")
        else:
            from prometheus_client import values

            if values.ValueClass is values.MutexValue:
                _why_off = (f"not exported: prometheus_client was imported in this process before {MULTIPROC_ENV} "
                            "was set, so its values stay in the process")
            else:
                _enabled = True
                _why_off = ""
        return EXPORTED if _enabled else _why_off


def enabled() -> bool:
    return _enabled


def model_name() -> str:
    return _model


def tp_rank() -> Optional[int]:
    return _tp_rank


def _full_labels(name: str, table: Mapping[str, tuple], labels: Mapping[str, Any]) -> Dict[str, str]:
    if name not in table:
        kind = "counter" if table is names.COUNTERS else "gauge"
        raise ValueError(f"{name!r} is not a {kind} of eagle3_capture.acceptance.names (expected one of "
                         f"{sorted(table)})")
    if not isinstance(labels, Mapping):
        raise ValueError(f"{name}: labels must be a dict, got {type(labels).__name__}")
    want = table[name][0]
    full = {k: str(v) for k, v in labels.items()}
    full[names.MODEL] = _model
    if names.TP_RANK in want and names.TP_RANK not in full and _tp_rank is not None:
        full[names.TP_RANK] = str(_tp_rank)
    if set(full) != set(want) or names.MODEL in labels:
        raise ValueError(f"{name}: labels {sorted(labels)}; expected {sorted(l for l in want if l != names.MODEL)} "
                         f"({names.MODEL} is added)")
    return full


def _metric(name: str):
    m = _metrics.get(name)
    if m is not None:
        return m
    from prometheus_client import Counter, Gauge

    with _lock:
        m = _metrics.get(name)
        if m is None:
            if name in names.COUNTERS:
                labels, help_text = names.COUNTERS[name]
                m = Counter(name, help_text, labels, registry=None)
            else:
                labels, help_text = names.GAUGES[name]
                m = Gauge(name, help_text, labels, registry=None, multiprocess_mode="max")
            _metrics[name] = m
    return m


def inc(name: str, labels: Mapping[str, Any], by=1) -> None:
    """Add `by` (a finite number >= 0) to the counter `name` with `labels`."""
    full = _full_labels(name, names.COUNTERS, labels)
    if isinstance(by, bool) or not isinstance(by, (int, float)) or not math.isfinite(by) or by < 0:
        raise ValueError(f"{name}: inc by {by!r}; expected a finite number >= 0")
    if not _enabled:
        return
    try:
        _metric(name).labels(**full).inc(by)
    except Exception as e:
        _fail(name, e)


def set_gauge(name: str, labels: Mapping[str, Any], value) -> None:
    """Set the gauge `name` with `labels` to `value` (a finite number)."""
    full = _full_labels(name, names.GAUGES, labels)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: value {value!r}; expected a finite number")
    if not _enabled:
        return
    try:
        _metric(name).labels(**full).set(value)
    except Exception as e:
        _fail(name, e)


def _fail(name: str, e: Exception) -> None:
    global _enabled, _why_off
    if not _enabled:
        return
    _enabled = False
    _why_off = f"export off after a failure ({type(e).__name__}: {e})"
    switches.announce("error", f"eagle3_capture: exporting {name} to Prometheus failed ({type(e).__name__}: {e}); "
                               "the plugin's metrics are not exported from this process any more (serving and the "
                               "acceptance alarm's log lines go on)")


def why_off() -> str:
    return _why_off


__all__ = ["configure", "enabled", "inc", "set_gauge", "model_name", "tp_rank", "why_off", "MULTIPROC_ENV",
           "EXPORTED"]
