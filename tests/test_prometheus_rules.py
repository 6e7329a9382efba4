"""monitoring/prometheus: `promtool check rules` on the rules file and `promtool test rules` on its unit tests (every
alert firing and not, every recording rule's value), and the rules read only metrics that names.py defines.

A missing `promtool` FAILS these tests (never a skip): `make test` installs it (Debian package `prometheus`)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from eagle3_capture.acceptance import names

MONITORING = Path(__file__).resolve().parents[1] / "monitoring" / "prometheus"
RULES = MONITORING / "eagle3_capture.rules.yml"
UNIT_TESTS = sorted((MONITORING / "tests").glob("*.yml"))
ALERTS = {"Eagle3AcceptanceDrift", "Eagle3CaptureSelfTestFailing", "Eagle3AcceptLengthLow",
          "Eagle3AcceptLengthDisagreesWithSGLang"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not on PATH: install Prometheus (`apt-get install -y prometheus` as root on "
                    "Debian/Ubuntu; `make test` does it), then run these tests again", pytrace=False)
    return found


def run(*args: str) -> str:
    done = subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)} failed ({done.returncode}):\n{out}"
    return out


def rules():
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_promtool_check_rules():
    out = run("check", "rules", str(RULES))
    assert f"SUCCESS: {len(rules())} rules found" in out, out


def test_promtool_unit_tests():
    assert UNIT_TESTS, f"no unit tests under {MONITORING / 'tests'}"
    out = run("test", "rules", *map(str, UNIT_TESTS))
    assert out.count("SUCCESS") == len(UNIT_TESTS), out


def test_every_rule_is_unit_tested():
    tested = "\n".join(p.read_text() for p in UNIT_TESTS)
    for r in rules():
        if "record" in r:
            assert f"expr: {r['record']}\n" in tested, f"recording rule {r['record']}: no promql_expr_test reads it"
        else:
            assert f"alertname: {r['alert']}\n" in tested, f"alert {r['alert']}: no alert_rule_test"
    assert {r["alert"] for r in rules() if "alert" in r} == ALERTS


def test_rules_read_only_the_exported_names():
    recorded = {r["record"] for r in rules() if "record" in r}
    exported = {names.exported(n) for n in [*names.COUNTERS, *names.GAUGES]}
    text = RULES.read_text()
    # scraped names are matched as {__name__=~"eagle3_capture[:_]<name>"} (either form a scrape may store)
    used = set(re.findall(r"eagle3_capture:[a-z_]+(?::[a-z0-9_]+)?", text))
    used |= {"eagle3_capture:" + n for n in re.findall(r'"eagle3_capture\[:_\]([a-z_]+)"', text)}
    unknown = used - recorded - exported
    assert not unknown, f"the rules read metrics names.py does not define: {sorted(unknown)}"
    # every raw metric feeds some rule (a new metric in names.py needs a thought about its rules)
    assert exported - used - {names.exported(names.SELFTEST_RUNS), names.exported(names.DRIFT)} == set()
    for r in recorded:
        assert r.count(":") == 2 and r.startswith(names.PREFIX), f"{r}: expected eagle3_capture:<what>:<how>"
