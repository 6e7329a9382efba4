"""A real Prometheus (the `prometheus` binary) for tests: it scrapes the /metrics URLs it is given every second,
evaluates monitoring/prometheus/eagle3_capture.rules.yml every second, and answers queries through its HTTP API.

    from prometheus_server import PrometheusServer

    with PrometheusServer("http://127.0.0.1:30000/metrics") as prom:     # SGLang started with --enable-metrics
        prom.wait_for("up", lambda s: s and all(x.value == 1 for x in s), timeout=30)   # or prom.targets_up()
        prom.wait_for("eagle3_capture:spec_verifies:rate5m", lambda s: s and s[0].value > 0, timeout=60)
        [length] = prom.query("eagle3_capture:spec_accept_length:rate5m")   # Series(labels={...}, value=2.31)
        firing = [a for a in prom.alerts() if a["state"] == "firing"]       # Prometheus' own alert objects
        assert prom.rule_errors() == []

It listens on 127.0.0.1 on a free port (``prom.url``), keeps its data in its own temporary directory and is stopped
(and the directory removed) when the ``with`` block ends, whatever happened inside. Every scraped series carries
``job`` (``job=``, "sglang" by default) and ``instance`` (the target's host:port), as in a real deployment.
A missing binary, a Prometheus that exits or never gets ready, a query Prometheus refuses: each raises
:class:`PrometheusError` with what was expected, what happened and the end of Prometheus' log. Test-only.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Union

from free_ports import free_port

RULES = Path(__file__).resolve().parents[1] / "monitoring" / "prometheus" / "eagle3_capture.rules.yml"
INSTALL_HINT = "install Prometheus: `apt-get install -y prometheus` (Debian/Ubuntu; `make test` does it as root)"
START_TIMEOUT_S = 30.0
PORT_ATTEMPTS = 3


class PrometheusError(RuntimeError):
    """Prometheus could not be started, or refused a request; the message ends with its log's last lines."""


@dataclass(frozen=True)
class Series:
    """One element of an instant query's result: its labels (``__name__`` included when it has one) and value."""
    labels: Dict[str, str]
    value: float


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        raise PrometheusError(f"no `prometheus` binary on PATH: {INSTALL_HINT}")
    return found


def scrape_config(url: str, job: str, interval_s: float) -> Dict[str, Any]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"scrape target: expected an http(s) URL such as http://127.0.0.1:30000/metrics, got {url!r}")
    return {"job_name": job, "scheme": parts.scheme, "metrics_path": parts.path or "/metrics",
            "scrape_interval": f"{interval_s:g}s", "scrape_timeout": f"{interval_s:g}s",
            "static_configs": [{"targets": [parts.netloc]}]}


class PrometheusServer:
    """A Prometheus process scraping ``targets`` (one /metrics URL or several, all under one job) with ``rules``
    loaded; use it as a context manager. ``interval_s`` is both the scrape and the rule evaluation interval."""

    def __init__(self, targets: Union[str, Sequence[str]], rules: Sequence[Union[str, Path]] = (RULES,),
                 job: str = "sglang", interval_s: float = 1.0):
        targets = [targets] if isinstance(targets, str) else list(targets)
        if not targets or not all(isinstance(t, str) for t in targets):
            raise ValueError(f"targets: expected one URL or a list of URLs, got {targets!r}")
        if not isinstance(interval_s, (int, float)) or isinstance(interval_s, bool) or not 0.1 <= interval_s <= 60:
            raise ValueError(f"interval_s: expected seconds in [0.1, 60], got {interval_s!r}")
        self.rules = [Path(r).resolve() for r in rules]
        for r in self.rules:
            if not r.is_file():
                raise ValueError(f"rules: expected a rules file, got {str(r)!r} (not a file)")
        scrapes = [scrape_config(t, job, interval_s) for t in targets]
        # one scrape config per target would repeat job_name (refused): the targets share one static config
        if len({(s["scheme"], s["metrics_path"]) for s in scrapes}) != 1:
            raise ValueError(f"targets: expected URLs with one scheme and one path, got {targets!r}")
        hosts = [s["static_configs"][0]["targets"][0] for s in scrapes]
        self.scrape = dict(scrapes[0], static_configs=[{"targets": hosts}])
        self.interval_s = float(interval_s)
        self.url = ""
        self.dir: Optional[str] = None
        self.proc: Optional[subprocess.Popen] = None

    # -- lifetime --------------------------------------------------------------------------------------------------
    def __enter__(self) -> "PrometheusServer":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        binary = prometheus_binary()
        self.dir = tempfile.mkdtemp(prefix="e3-prometheus-")
        config = {"global": {"scrape_interval": f"{self.interval_s:g}s",
                             "evaluation_interval": f"{self.interval_s:g}s"},
                  "rule_files": [str(r) for r in self.rules], "scrape_configs": [self.scrape]}
        config_path = os.path.join(self.dir, "prometheus.yml")
        with open(config_path, "w") as f:
            json.dump(config, f, indent=1)   # JSON is YAML
        self.log_path = os.path.join(self.dir, "prometheus.log")
        for _ in range(PORT_ATTEMPTS):   # the free port may be taken between finding it and binding it
            if self.launch(binary, config_path, free_port()):
                return
        raise PrometheusError(f"prometheus found no free port in {PORT_ATTEMPTS} tries{self.log_tail()}")

    def launch(self, binary: str, config_path: str, port: int) -> bool:
        """Start the process on ``port`` and wait until it is ready: True; False when the port was taken."""
        self.url = f"http://127.0.0.1:{port}"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={config_path}", f"--storage.tsdb.path={os.path.join(self.dir, 'data')}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=info"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.dir)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                if "address already in use" in self.log_tail():
                    return False
                raise PrometheusError(f"prometheus exited with {self.proc.returncode} while starting"
                                      f"{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:
                    if r.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, socket.timeout):
                pass
            if time.monotonic() > deadline:
                raise PrometheusError(f"prometheus not ready at {self.url} after {START_TIMEOUT_S:g} s"
                                      f"{self.log_tail()}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def log_tail(self, lines: int = 15) -> str:
        try:
            with open(self.log_path, "rb") as f:
                text = f.read().decode(errors="replace").splitlines()[-lines:]
        except (OSError, AttributeError):
            return ""
        return "\n--- prometheus log (last lines) ---\n" + "\n".join(text)

    # -- the HTTP API ----------------------------------------------------------------------------------------------
    def api(self, path: str, params: Optional[Dict[str, str]] = None) -> Any:
        """GET /api/v1/<path>: its ``data``; PrometheusError when Prometheus answers with an error."""
        if self.proc is None or self.proc.poll() is not None:
            raise PrometheusError(f"prometheus is not running (api {path}){self.log_tail()}")
        url = f"{self.url}/api/v1/{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                body = json.load(r)
        except urllib.error.HTTPError as e:   # 400/422: a bad query; the body says why
            body = json.loads(e.read().decode() or "{}")
        if body.get("status") != "success":
            raise PrometheusError(f"prometheus refused {path} {params or ''}: {body.get('errorType')}: "
                                  f"{body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> List[Series]:
        """The instant query ``expr`` now: a list of Series (one with empty labels for a scalar)."""
        data = self.api("query", {"query": expr})
        if data["resultType"] == "vector":
            return [Series(dict(s["metric"]), float(s["value"][1])) for s in data["result"]]
        if data["resultType"] == "scalar":
            return [Series({}, float(data["result"][1]))]
        raise PrometheusError(f"query {expr!r}: expected an instant vector or a scalar, got {data['resultType']}")

    def alerts(self) -> List[Dict[str, Any]]:
        """Active alerts (pending and firing) as Prometheus gives them: labels, annotations, state, activeAt, value."""
        return self.api("alerts")["alerts"]

    def targets(self) -> List[Dict[str, Any]]:
        """Active scrape targets as Prometheus gives them: scrapeUrl, health ("up", "down", "unknown"), lastError."""
        return self.api("targets")["activeTargets"]

    def targets_up(self) -> bool:
        """Whether every target has been scraped and its last scrape succeeded."""
        targets = self.targets()
        return bool(targets) and all(t["health"] == "up" for t in targets)

    def rule_errors(self) -> List[str]:
        """One line per rule whose last evaluation failed (an empty list when all evaluate)."""
        return [f"{r['name']}: {r.get('lastError')}" for g in self.api("rules")["groups"] for r in g["rules"]
                if r.get("health") == "err"]

    def wait_for(self, expr: str, predicate: Callable[[List[Series]], Any] = bool,
                 timeout: float = 30.0) -> List[Series]:
        """Query ``expr`` until ``predicate(result)`` is true (default: a non-empty result) and return that result;
        PrometheusError after ``timeout`` seconds, with the last result, the targets' state and the log's end."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if predicate(result):
                return result
            if time.monotonic() > deadline:
                targets = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in self.targets()]
                raise PrometheusError(f"{expr!r}: the condition did not hold within {timeout:g} s; last result "
                                      f"{result}; targets {targets}{self.log_tail()}")
            time.sleep(min(0.25, self.interval_s / 2))
