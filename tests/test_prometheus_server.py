"""The rules in a REAL Prometheus (tests/prometheus_server.py) scraping metrics written the way SGLang writes them:
two processes (tests/metrics_writer.py, standing in for two schedulers running the plugin) write eagle3-capture's
metrics with prometheus_client's multiprocess mode; an http.server thread serves what prometheus_client's
MultiProcessCollector makes of that directory through its own app, which negotiates the format as SGLang's /metrics
does. The recording rules must give the writer's traffic and the alerts must go pending / firing with the right
labels. About 20 s.

A missing `prometheus` binary fails these tests (it never skips them): `make test` installs it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

import metrics_writer as writer
from prometheus_server import PrometheusError, PrometheusServer, Series

from eagle3_capture.acceptance import names

pytestmark = pytest.mark.slow   # about 20 s: a real Prometheus must scrape and evaluate for a few seconds
TESTS = Path(__file__).resolve().parent
MODEL = "m"
TOL = 0.03   # the writer's counters move between two scrapes' reads of their files: a few % of jitter


def serve_multiprocess_dir(path: str):
    """/metrics as SGLang serves it with --enable-metrics: prometheus_client's own app (SGLang mounts its ASGI twin,
    make_asgi_app; both answer a Prometheus scrape in OpenMetrics, which writes the colons of the names as
    underscores) over a MultiProcessCollector of the multiprocess directory."""
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
    from socketserver import ThreadingMixIn

    from prometheus_client import make_wsgi_app

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args):   # Prometheus scrapes every second
            pass

    class Threading(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)
    server = make_server("127.0.0.1", 0, make_wsgi_app(registry), server_class=Threading, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    mp_dir = str(tmp_path_factory.mktemp("multiproc"))
    env = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=mp_dir)
    writers = [subprocess.Popen([sys.executable, str(TESTS / "metrics_writer.py"), "--rank", str(rank),
                                 "--share", "0.5", "--model", MODEL, "--seconds", "300"],
                                env=env, stdout=subprocess.PIPE, text=True)
               for rank in (0, 1)]
    server = None
    try:
        for w in writers:
            line = w.stdout.readline().strip()
            assert line == "ready", f"metrics_writer: expected 'ready', got {line!r} (exit code {w.poll()})"
        server = serve_multiprocess_dir(mp_dir)
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with PrometheusServer(url) as p:
            p.wait_for("up", lambda s: len(s) == 1 and s[0].value == 1, timeout=20)
            yield p
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        for w in writers:
            w.terminate()
            w.wait(timeout=10)


def test_targets_up_and_exposition_names(prom):
    assert prom.targets_up()
    # stored as an OpenMetrics scrape writes them: the prefix's colon as an underscore (the rules match both)
    scraped = {s.labels["__name__"] for s in prom.query('{__name__=~"eagle3_capture[:_][a-z_]+"}')}
    assert scraped == {names.exported(n).replace(":", "_") for n in [*names.COUNTERS, *names.GAUGES]}


def near(expected: dict, tol: float = TOL):
    """A wait_for predicate: one series per key of ``expected`` (a position, or None for a series without one),
    each within ``tol`` of its value (the first seconds of scraping are noisier: wait until they settle)."""
    def check(series):
        got = {s.labels.get("position"): s.value for s in series}
        return got.keys() == expected.keys() and all(abs(got[k] - v) <= tol for k, v in expected.items())
    return check


def test_recording_rules_give_the_traffic(prom):
    acceptance = {str(p): c / a for p, (a, c) in enumerate(zip(writer.ATTEMPTS_PER_S, writer.ACCEPTED_PER_S), 1)}
    found = prom.wait_for("eagle3_capture:spec_draft_acceptance:rate5m", near(acceptance), timeout=30)
    assert all(s.labels["model_name"] == MODEL and s.labels["job"] == "sglang" for s in found)
    # rate(x[5m]) divides by 5 minutes, of which this Prometheus has seen seconds: only the floor is checked; both
    # processes' counts (HISTORY_S of traffic, half each) are in the sum the exporter makes
    prom.wait_for("eagle3_capture:spec_verifies:rate5m", lambda s: len(s) == 1 and s[0].value >= 1, timeout=20)
    [total] = prom.query(f'{{__name__=~"{names.exported(names.VERIFIES).replace(":", "[:_]")}"}}')
    assert writer.VERIFIES_PER_S * writer.HISTORY_S <= total.value <= writer.VERIFIES_PER_S * (writer.HISTORY_S + 300)
    live = 1 + sum(writer.ACCEPTED_PER_S) / writer.VERIFIES_PER_S
    prom.wait_for("eagle3_capture:spec_accept_length:rate5m", near({None: live}), timeout=20)
    [expected] = prom.wait_for("eagle3_capture:expected_accept_length:max", timeout=10)
    assert expected.value == writer.EXPECTED_ACCEPT_LENGTH
    expected_acc = prom.wait_for("eagle3_capture:expected_acceptance:max", lambda s: len(s) == 3, timeout=10)
    assert sorted(s.value for s in expected_acc) == sorted(writer.EXPECTED_ACCEPTANCE)
    prom.wait_for("eagle3_capture:spec_accept_length:ratio_to_expected",
                  near({None: live / writer.EXPECTED_ACCEPT_LENGTH}), timeout=20)
    prom.wait_for("eagle3_capture:spec_draft_acceptance:ratio_to_expected",
                  near({p: a / e for (p, a), e in zip(acceptance.items(), writer.EXPECTED_ACCEPTANCE)}), timeout=20)
    [sglang] = prom.wait_for("eagle3_capture:sglang_spec_accept_length:avg5m", timeout=10)
    assert sglang.value == pytest.approx(writer.SGLANG_ACCEPT_LENGTH)
    assert prom.rule_errors() == []


def alert_states(prom):
    return {(a["labels"]["alertname"], a["state"]): a for a in prom.alerts()}


def test_alerts_fire_and_wait(prom):
    prom.wait_for('ALERTS{alertstate="firing"}', lambda s: len(s) >= 2, timeout=20)
    prom.wait_for('ALERTS{alertname="Eagle3AcceptLengthLow"}', timeout=20)
    states = alert_states(prom)
    drift = states[("Eagle3AcceptanceDrift", "firing")]
    assert drift["labels"]["position"] == writer.ALARM_POSITION and drift["labels"]["model_name"] == MODEL
    assert "draft position 2" in drift["annotations"]["summary"]
    assert "Expected: 62.5%" in drift["annotations"]["description"]
    assert "doctor online" in drift["annotations"]["description"]
    broken = states[("Eagle3CaptureSelfTestFailing", "firing")]
    assert broken["labels"]["tp_rank"] == "1" and broken["labels"]["severity"] == "critical"
    # 2.31 < 0.9 x 3 at >= 1 verify/s, but the alert waits 10 minutes: pending
    low = states[("Eagle3AcceptLengthLow", "pending")]
    assert float(low["value"]) == pytest.approx(2.3125, abs=0.1)   # its value at the last evaluation
    assert "the profile expects 3.00" in low["annotations"]["description"]
    # one alert per position in alarm, per broken rank; SGLang's 2.3 agrees with the plugin's count
    assert sorted(states) == [("Eagle3AcceptLengthLow", "pending"), ("Eagle3AcceptanceDrift", "firing"),
                              ("Eagle3CaptureSelfTestFailing", "firing")]


def test_helper_errors_say_what_happened(prom):
    with pytest.raises(PrometheusError, match="bad_data"):
        prom.query("rate(")
    with pytest.raises(PrometheusError, match="did not hold within"):
        prom.wait_for("eagle3_capture:no_such_series", timeout=0.5)
    assert prom.query("1 + 1") == [Series({}, 2.0)]
    with pytest.raises(ValueError, match="http"):
        PrometheusServer("127.0.0.1:30000")


def test_stopped_on_exit(tmp_path):
    with PrometheusServer("http://127.0.0.1:9/metrics") as p:   # nothing listens: the target is down, not an error
        proc, data = p.proc, p.dir
        assert p.query("1") == [Series({}, 1.0)]
    assert proc.poll() is not None and not os.path.exists(data)
    with pytest.raises(PrometheusError, match="not running"):
        p.query("1")


def test_a_taken_port_is_retried(monkeypatch):
    import socket

    import prometheus_server

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        offered = iter([taken])
        find = prometheus_server.free_port
        monkeypatch.setattr(prometheus_server, "free_port", lambda: next(offered, None) or find())
        with PrometheusServer("http://127.0.0.1:9/metrics") as p:
            assert not p.url.endswith(f":{taken}") and p.query("2") == [Series({}, 2.0)]


# ----------------------------------------------------------------------------------------------------------------
# issue 42: both name forms at once, the plugin's series absent beside SGLang's traffic, impossible counts
# ----------------------------------------------------------------------------------------------------------------

def serve_pages(pages):
    """One http.server per page maker (a function of the seconds since start returning the page's text, served in
    the text format): the /metrics of stand-in servers whose counters grow with time."""
    import http.server
    import time as _time

    t0 = _time.monotonic()
    servers = []
    for make in pages:
        class Handler(http.server.BaseHTTPRequestHandler):
            maker = staticmethod(make)

            def do_GET(self):
                body = self.maker(_time.monotonic() - t0 + 1000.0).encode()  # 1000 s of history: no cut at 0
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        s.daemon_threads = True
        threading.Thread(target=s.serve_forever, daemon=True).start()
        servers.append(s)
    return servers


def _both_forms(t):
    """The plugin's counters written twice, once per name form, at 10 verifies a second each (20 in all): what a
    Prometheus stores across a restart that changed the scrape format, held here for the whole window."""
    lines = []
    for sep in (":", "_"):
        lines += [f'eagle3_capture{sep}spec_verifies_total{{model_name="m"}} {10 * t}',
                  f'eagle3_capture{sep}spec_draft_attempts_total{{model_name="m",position="1"}} {10 * t}',
                  f'eagle3_capture{sep}spec_draft_accepted_total{{model_name="m",position="1"}} {5 * t}',
                  f'eagle3_capture{sep}acceptance_alarms_total{{model_name="m",position="1"}} 0',
                  f'eagle3_capture{sep}expected_acceptance{{model_name="m",position="1"}} 0.5',
                  f'eagle3_capture{sep}expected_accept_length{{model_name="m"}} 1.5',
                  f'sglang{sep}spec_accept_length{{model_name="m",tp_rank="0"}} 1.5']
    return "\n".join(lines + [f'sglang:spec_verify_calls_total{{model_name="m"}} {10 * t}']) + "\n"


def _no_plugin(t):
    """SGLang 0.5.23 serving speculative traffic without the plugin's series."""
    return f'sglang:spec_verify_calls_total{{model_name="m"}} {10 * t}\n'


def _impossible(t):
    """Position 1 accepted twice as often as it is reached, and a profile acceptance of 2."""
    return (f'eagle3_capture:spec_verifies_total{{model_name="m"}} {10 * t}\n'
            f'eagle3_capture:spec_draft_attempts_total{{model_name="m",position="1"}} {10 * t}\n'
            f'eagle3_capture:spec_draft_accepted_total{{model_name="m",position="1"}} {20 * t}\n'
            f'eagle3_capture:expected_acceptance{{model_name="m",position="1"}} 2\n')


def test_both_name_forms_the_absent_plugin_and_impossible_counts_in_a_real_prometheus():
    """A real Prometheus scraping three stand-ins. (a) both name forms at once: every rule evaluates (before, the
    recording rules and the drift alert failed with "vector cannot contain metrics with the same labelset") and
    the rates are the two forms' sum; (b) SGLang's verifies rising with no plugin series: Eagle3CaptureMetricsAbsent
    goes pending for that instance only; (c) impossible counts: not recorded, Eagle3CountsImpossible pending."""
    servers = serve_pages([_both_forms, _no_plugin, _impossible])
    both, absent, impossible = (f"127.0.0.1:{s.server_address[1]}" for s in servers)
    try:
        with PrometheusServer([f"http://{h}/metrics" for h in (both, absent, impossible)]) as p:
            p.wait_for("up", lambda s: len(s) == 3 and all(x.value == 1 for x in s), timeout=20)
            rate = p.wait_for(f'eagle3_capture:spec_verifies:rate5m{{instance="{both}"}}',
                              lambda s: len(s) == 1 and s[0].value > 0, timeout=20)[0].value
            # the two forms' rates, each read by its own name, add up to the recorded one
            forms = [p.query(f'sum(rate(eagle3_capture{sep}spec_verifies_total{{instance="{both}"}}[5m]))')[0].value
                     for sep in (":", "_")]
            assert forms[0] == pytest.approx(forms[1], rel=0.2) and rate == pytest.approx(sum(forms), rel=0.2)
            acc = p.wait_for(f'eagle3_capture:spec_draft_acceptance:rate5m{{instance="{both}"}}', timeout=20)
            assert len(acc) == 1 and acc[0].value == pytest.approx(0.5, abs=0.02)
            [al] = p.wait_for(f'eagle3_capture:spec_accept_length:rate5m{{instance="{both}"}}', timeout=20)
            assert al.value == pytest.approx(1.5, abs=0.02)
            [sg] = p.wait_for(f'eagle3_capture:sglang_spec_accept_length:avg5m{{instance="{both}"}}', timeout=20)
            assert sg.value == pytest.approx(1.5)
            p.wait_for('ALERTS{alertname="Eagle3CaptureMetricsAbsent"}', timeout=20)
            p.wait_for('ALERTS{alertname="Eagle3CountsImpossible"}', lambda s: len(s) == 2, timeout=20)
            assert p.rule_errors() == []
            states = {(a["labels"]["alertname"], a["labels"]["instance"], a["labels"].get("what")): a["state"]
                      for a in p.alerts()}
            assert states == {("Eagle3CaptureMetricsAbsent", absent, None): "pending",
                              ("Eagle3CountsImpossible", impossible, "live acceptance over 1"): "pending",
                              ("Eagle3CountsImpossible", impossible, "the profile's acceptance outside [0, 1]"):
                                  "pending"}, states
            # the impossible figures are not recorded
            assert p.query(f'eagle3_capture:spec_draft_acceptance:rate5m{{instance="{impossible}"}}') == []
            assert p.query(f'eagle3_capture:expected_acceptance:max{{instance="{impossible}"}}') == []
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
