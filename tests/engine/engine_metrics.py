"""What the engine tests read from a server's /metrics (the exposition text of SGLang's multiprocess collector),
beside what its responses report: the plugin's per-position acceptance counters against the sum of the responses'
``spec_correct_drafts_histogram``, read with prometheus_client's own parser (not the doctor's, which is under test
elsewhere)."""
from __future__ import annotations

import time
from typing import Dict, Iterable, List, Optional, Tuple

from eagle3_capture.acceptance import names
from eagle3_capture.acceptance.positions import add, attempts_accepted


def samples(text: str) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of an exposition text."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def by_position(text: str, name: str) -> Dict[int, float]:
    """{position: value} of one per-position metric (summed over other labels)."""
    out: Dict[int, float] = {}
    for (n, labels), v in samples(text).items():
        if n == names.exported(name):
            p = int(dict(labels)[names.POSITION])
            out[p] = out.get(p, 0.0) + v
    return out


def total(text: str, name: str, **match) -> float:
    """The sum of one metric's samples whose labels include `match`."""
    return sum(v for (n, labels), v in samples(text).items()
               if n == names.exported(name) and all(dict(labels).get(k) == str(x) for k, x in match.items()))


def acceptance(text: str, positions: int) -> Tuple[int, List[int], List[int]]:
    """(verifies, attempts per position, accepted per position) as the plugin exported them."""
    att, acc = by_position(text, names.ATTEMPTS), by_position(text, names.ACCEPTED)
    return (int(total(text, names.VERIFIES)), [int(att.get(p, 0)) for p in range(1, positions + 1)],
            [int(acc.get(p, 0)) for p in range(1, positions + 1)])


def responses_histogram(responses: Iterable[dict]) -> List[int]:
    """The sum of the responses' spec_correct_drafts_histogram."""
    h: List[int] = []
    for r in responses:
        h = add(h, r["meta_info"].get("spec_correct_drafts_histogram") or [])
    return h


def expected_from_responses(responses: Iterable[dict], positions: int) -> Tuple[int, List[int], List[int]]:
    h = responses_histogram(responses)
    att, acc = attempts_accepted(h, positions)
    return sum(h), att, acc


def minus(after: Tuple[int, List[int], List[int]], before: Optional[Tuple[int, List[int], List[int]]]):
    if before is None:
        return after
    return (after[0] - before[0], [a - b for a, b in zip(after[1], before[1])],
            [a - b for a, b in zip(after[2], before[2])])


__all__ = ["samples", "by_position", "total", "acceptance", "responses_histogram", "expected_from_responses",
           "minus"]


RECORDED = ("eagle3_capture:spec_verifies:rate5m", "eagle3_capture:spec_draft_acceptance:rate5m",
            "eagle3_capture:spec_accept_length:rate5m", "eagle3_capture:expected_acceptance:max",
            "eagle3_capture:expected_accept_length:max", "eagle3_capture:spec_draft_acceptance:ratio_to_expected",
            "eagle3_capture:spec_accept_length:ratio_to_expected", "eagle3_capture:sglang_spec_accept_length:avg5m")


def what_prometheus_saw(prom, positions: int, timeout: float = 60.0) -> dict:
    """Every recording rule of monitoring/prometheus as a real Prometheus evaluates it on the server it scrapes
    (once the per-position series are there), its alerts and its rule errors."""
    prom.wait_for("eagle3_capture:spec_draft_acceptance:rate5m", lambda s: len(s) >= positions, timeout=timeout)
    time.sleep(2.0)  # a scrape and an evaluation after the last flush
    return {"recorded": {name: [(s.labels, s.value) for s in prom.query(name)] for name in RECORDED},
            "alerts": [{"name": a["labels"].get("alertname"), "state": a["state"], "labels": a["labels"]}
                       for a in prom.alerts()],
            "rule_errors": prom.rule_errors()}


class Watch:
    """``eagle3-capture doctor watch`` against a live server for as long as the ``with`` block runs (ended with
    SIGTERM, which the watch takes like Ctrl-C: summary, --json and --plot written); then ``code``, ``out``,
    ``err``, and the files."""

    # every 5 s: the watch redraws its --plot PNG at every refresh (0.2 s of matplotlib each, for the whole life of
    # a server of 10-20 minutes); the alarm it reports is the server's, and a refresh every 5 s still sees it
    def __init__(self, url: str, profile: str, root: str, name: str, interval: float = 5.0):
        import os

        self.plot = os.path.join(root, f"watch_{name}.png")
        self.json = os.path.join(root, f"watch_{name}.json")
        self.cmd = ["-m", "eagle3_capture", "doctor", "watch", "--server", url, "--profile", profile, "--interval",
                    str(interval), "--plot", self.plot, "--json", self.json, "--no-progress"]
        self.interval = interval
        self.proc = None
        self.code = self.out = self.err = None

    def __enter__(self):
        import subprocess
        import sys

        # into files, not pipes: the view is printed every interval, and a pipe nobody reads until the end fills
        # (64 KiB) and blocks the watch mid-run
        self._out = open(self.json + ".stdout", "w+")
        self._err = open(self.json + ".stderr", "w+")
        self.proc = subprocess.Popen([sys.executable, *self.cmd], stdout=self._out, stderr=self._err, text=True)
        return self

    def __exit__(self, *exc):
        import signal
        import subprocess

        if self.proc.poll() is None:
            time.sleep(self.interval + 1.0)  # one more refresh after the last request
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.code = self.proc.returncode
        self.out, self.err = (self._read(f) for f in (self._out, self._err))
        return False

    @staticmethod
    def _read(f) -> str:
        f.flush()
        f.seek(0)
        text = f.read()
        f.close()
        return text

    def result(self) -> dict:
        return {"code": self.code, "out": self.out, "err": self.err, "plot": self.plot, "json": self.json}
