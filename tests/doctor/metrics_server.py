"""A stand-in for a server's /metrics in the watch tests: real Prometheus exposition text, made by prometheus_client's
own registry and generate_latest with the plugin's metric names (acceptance.names), served from a local http.server
on 127.0.0.1 in a thread. Each GET of /metrics answers the next page of a list (the last one repeats), so a test
says exactly what the watch reads at each refresh. A page may be an :class:`Answer` to misbehave: a Content-Length
that promises more than the body, or headers / body dripped a byte at a time (a server that never finishes)."""
from __future__ import annotations

import http.server
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Union

from eagle3_capture.acceptance import names
from eagle3_capture.acceptance.positions import attempts_accepted


@dataclass
class State:
    """What the plugin has counted (cumulative) and shows, for one page."""

    histogram: Sequence[int] = ()            # cumulative correct-drafts histogram (verifies per accepted count)
    positions: int = 3
    expected: Optional[Sequence[float]] = None
    expected_accept_length: Optional[float] = None
    drift: Optional[Sequence[float]] = None
    alarm: Optional[Sequence[int]] = None
    alarms: Optional[Sequence[int]] = None    # the ALARMS counter per position
    selftest: Dict[str, int] = field(default_factory=dict)
    selftest_failures: int = 0
    capture_broken: Optional[int] = None
    model: str = "m"


def page(s: State) -> bytes:
    from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

    reg = CollectorRegistry()
    c = {n: Counter(n, h, list(labels), registry=reg) for n, (labels, h) in names.COUNTERS.items()}
    g = {n: Gauge(n, h, list(labels), registry=reg) for n, (labels, h) in names.GAUGES.items()}
    m = s.model
    h = list(s.histogram)
    if h:
        att, acc = attempts_accepted(h, s.positions)
        c[names.VERIFIES].labels(m).inc(sum(h))
        for p in range(s.positions):
            c[names.ATTEMPTS].labels(m, str(p + 1)).inc(att[p])
            c[names.ACCEPTED].labels(m, str(p + 1)).inc(acc[p])
    for key, vals in ((names.EXPECTED_ACCEPTANCE, s.expected), (names.DRIFT, s.drift), (names.ALARM, s.alarm)):
        for p, v in enumerate(vals or ()):
            g[key].labels(m, str(p + 1)).set(v)
    for p, v in enumerate(s.alarms or ()):
        c[names.ALARMS].labels(m, str(p + 1)).inc(v)
    if s.expected_accept_length is not None:
        g[names.EXPECTED_ACCEPT_LENGTH].labels(m).set(s.expected_accept_length)
    for result, n in s.selftest.items():
        c[names.SELFTEST_RUNS].labels(m, "0", result).inc(n)
    c[names.SELFTEST_FAILURES].labels(m, "0").inc(s.selftest_failures)
    if s.capture_broken is not None:
        g[names.CAPTURE_BROKEN].labels(m, "0").set(s.capture_broken)
    return generate_latest(reg)


@dataclass
class Answer:
    """One misbehaving answer: `body` (a State or bytes), sent with Content-Length `length` (None: the body's),
    the headers dripped (`drip_headers`: one byte every `every` seconds, for ever) or the body dripped after the
    headers (`drip_body`)."""

    body: Union[State, bytes]
    length: Optional[int] = None
    drip_headers: bool = False
    drip_body: bool = False
    every: float = 0.05


def text_page(verifies, attempts, accepted, model="m", extra: str = "", positions=None) -> bytes:
    """A page written by hand (counters that prometheus_client's own registry could not hold, or that contradict
    each other): the plugin's counters for `model`, positions labelled `positions` (default "1".."P")."""
    labels = positions or [str(p + 1) for p in range(len(attempts))]
    lines = [f'eagle3_capture:spec_verifies_total{{model_name="{model}"}} {verifies}']
    for p, n, a in zip(labels, attempts, accepted):
        if n is not None:
            lines.append(f'eagle3_capture:spec_draft_attempts_total{{model_name="{model}",position="{p}"}} {n}')
        if a is not None:
            lines.append(f'eagle3_capture:spec_draft_accepted_total{{model_name="{model}",position="{p}"}} {a}')
    return ("\n".join(lines) + "\n" + extra).encode()


class MetricsServer:
    """Serves `pages` (State, raw bytes or an Answer) one per GET of /metrics; `.url` is its base URL."""

    def __init__(self, pages: Sequence[Union[State, bytes, Answer]], status: int = 200):
        self.pages: List[Union[bytes, Answer]] = [p if isinstance(p, (bytes, Answer)) else page(p) for p in pages]
        self.status = status
        self.gets = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path.rstrip("/") != "/metrics":
                    self.send_error(404)
                    return
                answer = outer.pages[min(outer.gets, len(outer.pages) - 1)]
                outer.gets += 1
                if not isinstance(answer, Answer):
                    answer = Answer(answer)
                body = answer.body if isinstance(answer.body, bytes) else page(answer.body)
                length = len(body) if answer.length is None else answer.length
                head = (f"HTTP/1.1 {outer.status} OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                        f"Content-Length: {length}\r\nConnection: close\r\n\r\n").encode()
                try:
                    if answer.drip_headers:
                        self._drip(head, answer.every)
                    self.wfile.write(head)
                    if answer.drip_body:
                        self._drip(body, answer.every)
                    self.wfile.write(body)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):  # the watch gave up on this reading
                    pass
                self.close_connection = True

            def _drip(self, data: bytes, every: float) -> None:
                """A byte every `every` seconds, for ever (cycling through `data`), until the client goes."""
                i = 0
                while not outer.stopping.is_set():
                    self.wfile.write(data[i % len(data):i % len(data) + 1])
                    self.wfile.flush()
                    i += 1
                    time.sleep(every)
                raise BrokenPipeError

            def log_message(self, *args):
                pass

        self.stopping = threading.Event()
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # shutdown() waits for serve_forever's next poll: 0.5 s by default, in every one of the fuzz's examples
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()
