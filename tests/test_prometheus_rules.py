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
          "Eagle3AcceptLengthDisagreesWithSGLang", "Eagle3CountsImpossible", "Eagle3CaptureMetricsAbsent"}
# SGLang's own metrics the rules read, as 0.5.23's observability/metrics_collector.py names them
SGLANG_NAMES = {"sglang:spec_accept_length", "sglang:spec_verify_calls_total", "sglang:generation_tokens_total"}


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


def rules_text() -> str:
    """Every rule's expression and annotations (not the file's comments, which quote names as examples)."""
    return "\n".join(str(r["expr"]) + "\n" + "\n".join(map(str, r.get("annotations", {}).values()))
                     for r in rules())


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
    text = rules_text()
    # scraped names are matched as {__name__=~"eagle3_capture[:_]<name>"} (either form a scrape may store)
    used = set(re.findall(r"eagle3_capture:[a-z_]+(?::[a-z0-9_]+)?", text))
    used |= {"eagle3_capture:" + n for n in re.findall(r'"eagle3_capture\[:_\]([a-z_]+)"', text)}
    used |= {"eagle3_capture:" + n for n in re.findall(r"\beagle3_capture_([a-z_]+)", text)}  # the OpenMetrics form
    unknown = used - recorded - exported
    assert not unknown, f"the rules read metrics names.py does not define: {sorted(unknown)}"
    # every raw metric feeds some rule (a new metric in names.py needs a thought about its rules)
    assert exported - used - {names.exported(names.SELFTEST_RUNS), names.exported(names.DRIFT)} == set()
    for r in recorded:
        assert r.count(":") == 2 and r.startswith(names.PREFIX), f"{r}: expected eagle3_capture:<what>:<how>"


RANGE_FUNCTION = re.compile(r"\b(rate|increase|sum_over_time|count_over_time|avg_over_time|max_over_time)\(([^\[]*)\[")


def test_no_range_function_over_both_forms_at_once():
    """A function over a range drops the metric name: over {__name__=~"...[:_]x"} it gives two series with one label
    set when both forms are in the window, and the rule fails ("vector cannot contain metrics with the same
    labelset"). Every such function reads one name, and each is read in both forms within the same rule."""
    for r in rules():
        expr = r["expr"]
        calls = RANGE_FUNCTION.findall(expr)
        for fn, arg in calls:
            assert "__name__" not in arg, f"{r.get('record') or r.get('alert')}: {fn}({arg}[...]) matches a regex"
        read = {arg.strip() for _, arg in calls}
        for name in read:
            prefix = "eagle3_capture" if name.startswith("eagle3_capture") else "sglang"
            tail = name[len(prefix):]
            other = prefix + ({":": "_", "_": ":"}[tail[0]]) + tail[1:]
            assert other in read, f"{r.get('record') or r.get('alert')}: {name} is read under a range function " \
                                  f"without its other form {other}"


def test_the_sglang_names_the_rules_read_are_sglangs():
    """The rules read SGLang's own metrics by name: each is one SGLang 0.5.23 exports (read in its metrics
    collector's source, not imported), so a rename there shows here."""
    import importlib.util

    text = rules_text()
    used = set(re.findall(r"\bsglang:[a-z_]+", text)) | {"sglang:" + n for n in re.findall(r"\bsglang_([a-z_]+)", text)}
    used |= {"sglang:" + n for n in re.findall(r'"sglang\[:_\]([a-z_]+)"', text)}
    assert used == SGLANG_NAMES, used
    spec = importlib.util.find_spec("sglang")
    if spec is None or spec.origin is None:
        pytest.fail("sglang is not installed: the names the rules read cannot be checked against it")
    src = Path(spec.origin).parent / "srt" / "observability" / "metrics_collector.py"
    defined = set(re.findall(r'name="(sglang:[a-z_]+)"', src.read_text()))
    assert SGLANG_NAMES <= defined, SGLANG_NAMES - defined
