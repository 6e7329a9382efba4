"""doctor watch against a stand-in /metrics (metrics_server.py: prometheus_client's own exposition of the plugin's
metric names, from a local http.server, one page per reading): the figures it shows (live and since-start
acceptance per position, verifies, accept length, expected from the server or a profile), alarms -> exit 1 (the
server's gauge and counter, a broken capture, the client-side monitor), restarts, a server that goes away, Ctrl-C,
the plot and the series; bad inputs -> exit 2 with one line; and hypothesis over garbage pages and flag values."""
from __future__ import annotations

import io
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import fuzz_examples
from doctor_helpers import assert_clean_error, cli
from free_ports import free_port
from metrics_server import Answer, MetricsServer, State, page, text_page
from eagle3_capture.acceptance import names
from eagle3_capture.acceptance import profile as acceptance_profile
from eagle3_capture.doctor.common import DoctorError
from eagle3_capture.doctor.watch.scrape import parse
from eagle3_capture.doctor.watch.series import Watcher
from eagle3_capture.doctor.watch.view import CLEAR, View

FAST = ["--interval", "0.1", "--no-progress"]
EXP = dict(expected=[0.8, 0.7, 0.6], expected_accept_length=2.5)


def watch(pages, *extra, count=None):
    with MetricsServer(pages) as s:
        n = len(pages) - 1 if count is None else count
        code, out, err = cli("doctor", "watch", "--server", s.url, *FAST, "--count", n, *extra)
    assert "Traceback" not in out + err, out + err
    return code, out, err


def series(path):
    return json.load(open(path))


# ----------------------------------------------------------------------------------------------------------------
# parsing
# ----------------------------------------------------------------------------------------------------------------

def test_parse_sums_series_and_keeps_the_largest_gauge():
    a = page(State([10, 20, 30, 40], alarm=[0, 1, 0], drift=[0.1, 1.3, 0.0], selftest={"passed": 2},
                   capture_broken=0, model="a", **EXP)).decode()
    b = page(State([1, 1, 1, 1], alarm=[0, 0, 0], drift=[0.5, 0.2, 0.0], selftest={"failed": 1},
                   selftest_failures=1, capture_broken=1, model="b")).decode()
    snap = parse(a + b.replace("# HELP", "# xHELP").replace("# TYPE", "# xTYPE"), "p")  # two models' series
    assert snap.models == ("a", "b")
    assert snap.verifies == 104
    assert snap.attempts == {1: 104, 2: 93, 3: 72} and snap.accepted == {1: 93, 2: 72, 3: 41}
    assert snap.drift == {1: 0.5, 2: 1.3, 3: 0.0} and snap.alarm == {1: 0, 2: 1, 3: 0}
    assert snap.expected == {1: 0.8, 2: 0.7, 3: 0.6} and snap.expected_accept_length == 2.5
    assert snap.selftest_runs == {"passed": 2, "failed": 1} and snap.selftest_failures == 1
    assert snap.capture_broken == {"0": 1}


@pytest.mark.parametrize("body, needle", [
    ("", "no eagle3_capture:* metrics"), ("sglang:num_requests_running 3\n", "--enable-metrics"),
    ('eagle3_capture:spec_draft_attempts_total{position="x"} 3\n', "position"),
    ('eagle3_capture:spec_draft_attempts_total{position="0"} 3\n', "position"),
    ('eagle3_capture:spec_draft_attempts_total{position="65"} 3\n', "position"),
    ('eagle3_capture:spec_verifies_total -1\n', "never negative"),
    ('eagle3_capture:spec_verifies_total NaN\n', "finite"),
    ('eagle3_capture:spec_verifies_total 1\neagle3_capture:acceptance_alarm{position="1"} 2\n', "[0, 1]"),
    ('eagle3_capture:selftest_runs_total{result="passed"} 1\n', "no acceptance counters"),
    ('eagle3_capture:spec_verifies_total{a="\n', "Prometheus text format"),
])
def test_parse_refuses(body, needle):
    with pytest.raises(DoctorError) as ei:
        parse(body, "page")
    assert needle in str(ei.value) and "\n" not in str(ei.value), str(ei.value)


# ----------------------------------------------------------------------------------------------------------------
# the view's numbers
# ----------------------------------------------------------------------------------------------------------------

def test_live_and_since_start_figures(tmp_path):
    pages = [State([10, 10, 10, 10], selftest={"passed": 1}, capture_broken=0, **EXP),
             State([30, 30, 30, 30], selftest={"passed": 3}, capture_broken=0, **EXP),   # +20 each bin
             State([30, 30, 30, 70], selftest={"passed": 3}, capture_broken=0, **EXP)]   # +40 full accepts
    code, out, err = watch(pages, "--json", tmp_path / "w.json")
    assert code == 0, out + err
    j = series(tmp_path / "w.json")
    assert j["alarm"] is False and j["expected_source"] == "server" and j["ended"] == "count"
    r0, r1, r2 = j["refreshes"]
    assert r0["verifies"] is None and r0["positions"][0]["attempts"] is None
    # interval 1: h = [20, 20, 20, 20]: attempts 80, 60, 40; accepted 60, 40, 20
    assert r1["verifies"] == 80 and [p["attempts"] for p in r1["positions"]] == [80, 60, 40]
    assert [p["live"] for p in r1["positions"]] == pytest.approx([60 / 80, 40 / 60, 20 / 40])
    assert r1["accept_length"] == pytest.approx(1 + (20 + 40 + 60) / 80)
    assert r1["selftest"]["runs"] == {"passed": 2}
    # interval 2: 40 verifies that accepted all three
    assert r2["verifies"] == 40 and [p["live"] for p in r2["positions"]] == [1.0, 1.0, 1.0]
    assert [p["since_start"] for p in r2["positions"]] == pytest.approx([100 / 120, 80 / 100, 60 / 80])
    assert r2["accept_length_since_start"] == pytest.approx(1 + (120 + 120) / 120)
    assert [p["expected"] for p in r2["positions"]] == [0.8, 0.7, 0.6] and r2["expected_accept_length"] == 2.5
    assert r2["verifies_per_s"] > 0
    # the text: plain blocks (not a terminal: nothing cleared), the figures, the summary
    assert CLEAR not in out and "\x1b" not in out
    assert "0.750 (60/80)" in out and "1.000 (40/40)" in out and "0.833 (100/120)" in out
    assert "verdict: no alarm" in out and "self-test: 2 runs, 0 failures while watched" in out


def test_no_profile_anywhere_is_said(tmp_path):
    code, out, err = watch([State([5, 5, 5, 5]), State([6, 6, 6, 6])])
    assert code == 0 and "no profile" in out, out


def test_terminal_view_redraws():
    out = io.StringIO()
    out.isatty = lambda: True
    w = Watcher(None, 1.0)
    v = View(out, ["head"], "none", False)
    v.show(w.update(parse(page(State([1, 2, 3, 4])).decode(), "p"), 0.0, None))
    assert out.getvalue().startswith(CLEAR) and "head" in out.getvalue() and "Ctrl-C" in out.getvalue()


# ----------------------------------------------------------------------------------------------------------------
# alarms, restarts, a server that goes away, Ctrl-C
# ----------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("late, source", [
    (dict(alarm=[0, 1, 0], drift=[0, 1.1, 0]), "server-alarm"),
    (dict(alarms=[0, 0, 1]), "server-alarms-counter"),
    (dict(capture_broken=1, selftest={"failed": 1}, selftest_failures=1), "capture-broken"),
])
def test_alarms_exit_1(tmp_path, late, source):
    pages = [State([10, 10, 10, 10], **EXP), State([20, 20, 20, 20], **EXP, **late)]
    code, out, err = watch(pages, "--json", tmp_path / "w.json")
    assert code == 1, out + err
    j = series(tmp_path / "w.json")
    assert j["alarm"] and [a["source"] for a in j["alarms"]][0] == source
    assert "verdict: ALARM" in out and "ALARM: " in out


def test_an_alarm_counted_before_the_watch_is_not_new():
    pages = [State([10, 10, 10, 10], alarms=[3, 0, 0], **EXP), State([20, 20, 20, 20], alarms=[3, 0, 0], **EXP)]
    code, out, err = watch(pages)
    assert code == 0, out


def write_profile(tmp_path, hist=(100, 200, 300, 4400), steps=3):
    prof = acceptance_profile.make("doctor accept", acceptance_profile.Speculative(steps, 1, steps + 1), list(hist), 8)
    return acceptance_profile.write(prof, str(tmp_path / "profile.json"))


def test_client_side_monitor_with_a_profile(tmp_path):
    path = write_profile(tmp_path)  # acceptance ~0.98 / 0.93 / 0.94
    good = [State([0, 0, 0, 10 * i]) for i in range(1, 4)]          # everything accepted: in control
    drops = []
    for i in range(1, 4):  # then every verify rejects the first draft: 200 a refresh
        drops.append(State([200 * i, 0, 0, 30]))
    code, out, err = watch(good + drops, "--profile", path, "--json", tmp_path / "w.json", "--plot",
                           tmp_path / "w.png")
    assert code == 1, out + err
    j = series(tmp_path / "w.json")
    assert j["expected_source"] == "profile" and j["profile"] == path
    assert any(a["source"] == "client-monitor" and a["position"] == 1 for a in j["alarms"]), j["alarms"]
    assert j["client_monitor"]["block_seconds"] == 0.1 and j["client_monitor"]["positions"] == 3
    assert "bound is per interval" in out and "client-side monitor: eagle3_capture: acceptance drift ALARM" in out
    assert [p["expected"] for p in j["refreshes"][1]["positions"]] == \
        pytest.approx(acceptance_profile.read(path).acceptance())
    with open(tmp_path / "w.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]


def test_restart_is_noted_not_garbage(tmp_path):
    pages = [State([10, 10, 10, 100], **EXP), State([20, 20, 20, 200], **EXP),
             State([1, 2, 3, 4], **EXP),                     # the server restarted: counters from 0
             State([2, 3, 4, 5], **EXP)]
    code, out, err = watch(pages, "--json", tmp_path / "w.json")
    assert code == 0, out + err
    j = series(tmp_path / "w.json")
    r = j["refreshes"]
    assert j["restarts"] == 1 and r[2]["restart"] and not r[3]["restart"]
    assert r[2]["verifies"] == 10 and [p["attempts"] for p in r[2]["positions"]] == [10, 9, 7]
    assert r[3]["verifies"] == 4 and all(p["attempts"] >= 0 and p["accepted"] >= 0 for x in r for p in x["positions"]
                                         if p["attempts"] is not None)
    assert r[3]["total_verifies"] == 130 + 10 + 4
    assert "RESTART" in out and "server restarted" in out and "1 server restart(s)" in out


def test_a_server_that_goes_away_is_noted(tmp_path):
    with MetricsServer([State([1, 1, 1, 1], **EXP)]) as s:
        url = s.url
        s.pages.append(b"")  # the second reading: an empty page, no plugin metrics
        code, out, err = cli("doctor", "watch", "--server", url, *FAST, "--count", 2, "--json", tmp_path / "w.json")
    assert code == 3, out + err  # no alarm seen, but a reading could not be judged: not "fine"
    j = series(tmp_path / "w.json")
    assert j["refreshes"][1]["error"] and "no reading" in out and j["failed_readings"] == 2
    assert "could not be judged (exit 3)" in out


def test_ctrl_c_ends_with_the_summary(tmp_path, monkeypatch):
    import eagle3_capture.doctor.commands.watch as cmd

    calls = []
    real_sleep = cmd.time.sleep

    def sleep(s):
        calls.append(s)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_sleep(s)

    monkeypatch.setattr(cmd.time, "sleep", sleep)
    with MetricsServer([State([1, 1, 1, 1], **EXP), State([2, 2, 2, 2], **EXP)]) as s:
        code, out, err = cli("doctor", "watch", "--server", s.url, *FAST, "--json", tmp_path / "w.json")
    assert code == 0, out + err
    assert "stopped by Ctrl-C" in out and series(tmp_path / "w.json")["ended"] == "interrupted"


# ----------------------------------------------------------------------------------------------------------------
# issue 42: each reading judged whole; a bad reading is a failed reading (exit 3 later, exit 2 first), never a figure
# ----------------------------------------------------------------------------------------------------------------

GOOD_PAGES = [State([10, 10, 10, 10], **EXP), State([20, 20, 20, 20], **EXP)]
BAD_READINGS = {
    # positions 2-3 gone for one scrape (a partial page)
    "series missing": text_page(100, [100, None, None], [75, None, None]),
    # cut at a line boundary: the body ends early, its Content-Length promised more
    "cut short": Answer(page(State([30, 30, 30, 30], **EXP)).split(b"# HELP eagle3_capture:spec_draft_accepted")[0],
                        length=len(page(State([30, 30, 30, 30], **EXP)))),
    "accepted > attempts": text_page(200, [200, 150, 100], [250, 100, 50]),
    "accept length 251 with 3 positions": text_page(1, [1, 1, 1], [1, 1, 248]),  # 1 + (1 + 1 + 248) / 1
    "accepted at 2 > at 1": text_page(200, [200, 150, 140], [150, 140, 151]),
    "attempts at 2 > accepted at 1": text_page(200, [200, 150, 150], [100, 100, 50]),
    "attempts at 1 > verifies": text_page(100, [200, 150, 100], [150, 100, 50]),
    "a duplicated series": text_page(200, [200, 150, 100], [150, 100, 50],
                                     extra='eagle3_capture:spec_verifies_total{model_name="m"} 200\n'),
    'position="01"': text_page(200, [200, 150, 100], [150, 100, 50], positions=["01", "2", "3"]),
    'position="1.0"': text_page(200, [200, 150, 100], [150, 100, 50], positions=["1.0", "2", "3"]),
    'position=" 1"': text_page(200, [200, 150, 100], [150, 100, 50], positions=[" 1", "2", "3"]),
    'position="+1"': text_page(200, [200, 150, 100], [150, 100, 50], positions=["+1", "2", "3"]),
    "a NaN gauge": text_page(200, [200, 150, 100], [150, 100, 50],
                             extra='eagle3_capture:expected_accept_length{model_name="m"} NaN\n'),
    "100 of 5000 promised bytes": Answer(page(State([30, 30, 30, 30], **EXP))[:100], length=5000),
    "an accept counter down, verifies not": text_page(81, [81, 61, 41], [61, 41, 5]),  # accepted at 3: 20 -> 5
}
NEEDLES = {"series missing": "missing", "cut short": "Content-Length promises",
           "accepted > attempts": "accepted of", "accept length 251 with 3 positions": "248 accepted of 1",
           "accepted at 2 > at 1": "accepted of", "attempts at 2 > accepted at 1": "accepted at position 1",
           "attempts at 1 > verifies": "verifies", "a duplicated series": "appears twice",
           'position="01"': "position='01'", 'position="1.0"': "position='1.0'", 'position=" 1"': "position=' 1'",
           'position="+1"': "position='+1'", "a NaN gauge": "finite",
           "100 of 5000 promised bytes": "100 of the 5000 bytes", "an accept counter down, verifies not":
           "went down"}


@pytest.mark.parametrize("what", sorted(BAD_READINGS))
def test_a_bad_reading_mid_watch_is_a_failed_reading_never_a_figure(tmp_path, what):
    """The bad reading between two good ones: it fails with its one-line reason, shows no figure, and the watch
    exits 3 (could not judge), not 0. Before: exit 0 with "accept length -1.300", acceptance -0.800 (-80/100), a
    traceback from drift.py with --profile, or "no speculative traffic"."""
    pages = [GOOD_PAGES[0], GOOD_PAGES[1], BAD_READINGS[what], State([40, 40, 40, 40], **EXP)]
    prof = write_profile(tmp_path, hist=(100, 200, 300, 400))
    code, out, err = watch(pages, "--json", tmp_path / "w.json", "--profile", prof)
    assert code == 3, out + err
    j = series(tmp_path / "w.json")
    bad = j["refreshes"][2]
    assert bad["error"] and NEEDLES[what] in bad["error"] and "\n" not in bad["error"], bad["error"]
    assert bad["verifies"] is None and bad["positions"] == []
    # the next good reading is compared with the last good one: its figures are right
    last = j["refreshes"][3]
    assert last["verifies"] == 80 and [p["attempts"] for p in last["positions"]] == [80, 60, 40]
    for r in j["refreshes"]:
        for p in r["positions"]:
            assert p["live"] is None or 0 <= p["live"] <= 1
        assert r["accept_length"] is None or 1 <= r["accept_length"] <= 4
    assert "verdict: no alarm in the readings judged; 1 of 4 could not be judged (exit 3)" in out


@pytest.mark.parametrize("what", sorted(BAD_READINGS))
def test_a_bad_first_reading_is_bad_input(what):
    """The first reading bad: exit 2, one line naming why."""
    if what in ("an accept counter down, verifies not", "series missing"):
        return  # relations between two readings: a first reading is judged on its own (positions 1..1 are whole)
    with MetricsServer([BAD_READINGS[what]]) as s:
        code, out, err = cli("doctor", "watch", "--server", s.url, *FAST, "--count", 1)
    assert_clean_error(code, out, err, NEEDLES[what])


@pytest.mark.parametrize("drip", ["drip_headers", "drip_body"])
def test_a_dripping_server_fails_the_reading_at_its_deadline(drip):
    """The deadline is per reading, not per recv: a server that sends a byte every 50 ms for ever fails the
    reading in about the deadline (2 s at --interval 0.1), and the watch ends. Before: it hung."""
    import time

    drips = Answer(page(State([30, 30, 30, 30], **EXP)), **{drip: True})
    t0 = time.monotonic()
    code, out, err = watch([GOOD_PAGES[0], GOOD_PAGES[1], drips], count=2)
    took = time.monotonic() - t0
    assert code == 3 and "did not complete within 2 s" in out, out + err
    assert took < 15, took
    with MetricsServer([drips]) as s:
        code, out, err = cli("doctor", "watch", "--server", s.url, *FAST, "--count", 1)
    assert_clean_error(code, out, err, "did not complete within 2 s")


def test_a_drift_over_the_threshold_is_an_alarm_whatever_the_alarm_gauge_says(tmp_path):
    """A drift statistic of 1e308 with the alarm gauge at 0 was printed as "ok": the gauge follows the statistic,
    which is over its threshold, so it is an alarm."""
    pages = [State([10, 10, 10, 10], alarm=[0, 0, 0], drift=[0, 0, 0], **EXP),
             State([20, 20, 20, 20], alarm=[0, 0, 0], drift=[0, 1e308, 0], **EXP)]
    code, out, err = watch(pages, "--json", tmp_path / "w.json")
    assert code == 1 and ">999" in out and "ALARM" in out, out
    assert series(tmp_path / "w.json")["alarms"][0]["position"] == 2


def test_an_interval_read_mid_flush_is_merged_into_the_next():
    """Two consistent readings whose interval is not (the first read between two of the server's counters in its
    flush): that interval shows no figure and counts nothing; the next one starts from it."""
    w = Watcher(None, 1.0)
    w.update(parse(text_page(100, [100, 80, 60], [80, 60, 30]).decode(), "p"), 0.0, None)
    # mid-flush: verifies and position 1's attempts counted 10 more, its accepted not yet
    mid = w.update(parse(text_page(110, [110, 80, 60], [80, 60, 30]).decode(), "p"), 1.0, 1.0)
    assert mid.verifies == 10 and [(x.attempts, x.accepted) for x in mid.rows] == [(10, 0), (0, 0), (0, 0)]
    # the rest of that flush: accepted at 1 and attempts at 2 follow, with no new verify: no figure, nothing counted
    r = w.update(parse(text_page(110, [110, 88, 64], [88, 64, 30]).decode(), "p"), 2.0, 1.0)
    assert r.verifies is None and r.error is None and "during one of the server's flushes" in r.notes[0]
    assert [(x.attempts, x.accepted) for x in r.rows] == [(None, None)] * 3
    r = w.update(parse(text_page(120, [120, 96, 68], [96, 68, 32]).decode(), "p"), 3.0, 1.0)
    assert r.verifies == 10 and [(x.attempts, x.accepted) for x in r.rows] == [(10, 8), (8, 4), (4, 2)]
    assert [(x.total_attempts, x.total_accepted) for x in r.rows] == [(20, 8), (8, 4), (4, 2)]


def test_one_model_restarting_beside_another_counts_per_series():
    """Two served models; one restarts (its counters from 0), the other goes on: each series' interval is its own
    increase (the restarted one's value), not the other's whole count."""
    a1, b1 = text_page(100, [100, 80, 60], [80, 60, 30], "a"), text_page(50, [50, 40, 30], [40, 30, 10], "b")
    a2, b2 = text_page(120, [120, 96, 72], [96, 72, 36], "a"), text_page(5, [5, 4, 3], [4, 3, 1], "b")
    w = Watcher(None, 1.0)
    w.update(parse((a1 + b1).decode(), "p"), 0.0, None)
    r = w.update(parse((a2 + b2).decode(), "p"), 1.0, 1.0)
    assert r.restart and r.verifies == 20 + 5 and [(x.attempts, x.accepted) for x in r.rows] == \
        [(20 + 5, 16 + 4), (16 + 4, 12 + 3), (12 + 3, 6 + 1)]


PAGE_PARTS = st.fixed_dictionaries({
    "verifies": st.integers(0, 300), "attempts": st.lists(st.integers(0, 300) | st.none(), min_size=0, max_size=4),
    "accepted": st.lists(st.integers(0, 300) | st.none(), min_size=0, max_size=4),
    "labels": st.lists(st.sampled_from(["1", "2", "3", "4", "01", "0", "1.0", "x"]), min_size=4, max_size=4)})


@settings(max_examples=fuzz_examples(300), deadline=None)
@given(pages=st.lists(PAGE_PARTS, min_size=1, max_size=6))
def test_fuzz_no_figure_from_a_bad_reading(pages):
    """Any sequence of hand-written pages (impossible counters, gaps, bad labels, resets): every refresh is either
    a failed reading with one line, or figures that keep every relation: 0 <= live <= 1, accepted <= attempts,
    accept length <= positions + 1, totals consistent."""
    w = Watcher(None, 1.0)
    for i, pp in enumerate(pages):
        body = text_page(pp["verifies"], pp["attempts"], pp["accepted"][:len(pp["attempts"])]
                         + [None] * max(0, len(pp["attempts"]) - len(pp["accepted"])),
                         positions=pp["labels"][:len(pp["attempts"])])
        try:
            r = w.update(parse(body.decode(), "p"), float(i), 1.0)
        except DoctorError as e:
            r = w.failed(float(i), str(e))
            assert "\n" not in str(e)
            continue
        P = len(r.rows)
        for row in r.rows:
            assert row.attempts is None or 0 <= row.accepted <= row.attempts
            assert 0 <= row.total_accepted <= row.total_attempts
        if r.accept_length is not None:
            assert 1 <= r.accept_length <= P + 1
        if r.accept_length_since_start is not None:
            assert 1 <= r.accept_length_since_start <= P + 1


# ----------------------------------------------------------------------------------------------------------------
# bad inputs
# ----------------------------------------------------------------------------------------------------------------

def test_bad_inputs_exit_2(tmp_path):
    code, out, err = cli("doctor", "watch", "--server", f"http://127.0.0.1:{free_port()}", *FAST, "--count", 1)
    assert_clean_error(code, out, err, "cannot reach")
    code, out, err = cli("doctor", "watch", "--server", "ftp://x", "--count", 1)
    assert_clean_error(code, out, err, "--server")
    for flags in (["--interval", "0"], ["--interval", "nan"], ["--count", "0"], ["--plot", tmp_path / "a.jpg"],
                  ["--plot", "/proc/nope/a.png"]):
        code, out, err = cli("doctor", "watch", "--server", "http://127.0.0.1:9", *flags)
        assert_clean_error(code, out, err, flags[0])
    with MetricsServer([b"sglang:num_requests_running 1\n"]) as s:
        code, out, err = cli("doctor", "watch", "--server", s.url, *FAST, "--count", 1)
    assert_clean_error(code, out, err, "--enable-metrics")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "nope"}')
    with MetricsServer([State([1, 1, 1, 1])]) as s:
        for p in (bad, tmp_path / "missing.json", tmp_path):
            code, out, err = cli("doctor", "watch", "--server", s.url, *FAST, "--count", 1, "--profile", p)
            assert_clean_error(code, out, err, "--profile")
    with MetricsServer([State([1, 1, 1, 1])], status=404) as s:
        code, out, err = cli("doctor", "watch", "--server", s.url, *FAST, "--count", 1)
    assert_clean_error(code, out, err, "HTTP 404", "--enable-metrics")


FUZZ = settings(max_examples=fuzz_examples(40), deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
GOOD = page(State([10, 20, 30, 40], alarm=[0, 0, 0], drift=[0.1, 0.2, 0.3], selftest={"passed": 1},
                  capture_broken=0, **EXP)).decode()
TOKENS = ["NaN", "-1", "+Inf", "x", "1e400", "", "{", "}", '"', "position=\"0\"", "position=\"99\"", "\\", "#",
          "eagle3_capture:spec_verifies_total", "\x00", "é", "0x10", "1_0"]


@st.composite
def garbage_pages(draw):
    kind = draw(st.sampled_from(["bytes", "text", "mutated"]))
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "text":
        return draw(st.text(max_size=300)).encode("utf-8", "surrogatepass")
    lines = GOOD.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        parts = lines[i].split(" ")
        j = draw(st.integers(0, len(parts) - 1))
        parts[j] = draw(st.sampled_from(TOKENS) | st.text(max_size=6))
        lines[i] = " ".join(parts)
    return "\n".join(lines).encode("utf-8", "surrogatepass")


@FUZZ
@given(body=garbage_pages())
def test_fuzz_garbage_pages(body):
    with MetricsServer([body]) as s:
        code, out, err = cli("doctor", "watch", "--server", s.url, *FAST, "--count", 1)
    assert code in (0, 1, 2, 3), (code, err)
    assert "Traceback" not in out + err
    if code == 2:
        assert_clean_error(code, out, err)
        assert len(err.strip().splitlines()) == 1, err


@settings(max_examples=fuzz_examples(400), deadline=None)
@given(body=garbage_pages())
def test_fuzz_parse_garbage(body):
    """The parser alone, many more pages: a Snapshot or a one-line DoctorError, nothing else."""
    try:
        snap = parse(body.decode("utf-8", "replace"), "page")
    except DoctorError as e:
        assert "\n" not in str(e)
        return
    assert snap.verifies >= 0 and all(1 <= p <= 64 for p in snap.positions())


@st.composite
def watch_argv(draw, tmp):
    argv = ["doctor", "watch"]
    if draw(st.booleans()):
        argv.append("--server=" + draw(st.sampled_from(["http://127.0.0.1:9", "https://h/x", "ftp://h", "", "h:1",
                                                        "http://", "http://h:99999", "http://h/ a"]) | st.text(max_size=8)))
    flags = {"--interval": st.sampled_from(["0", "0.1", "5", "3600", "3601", "-1", "nan", "inf", "x", ""]) |
             st.floats().map(repr),
             "--count": st.sampled_from(["0", "1", "-1", "x", "1.5", ""]) | st.integers().map(str),
             "--plot": st.sampled_from([f"{tmp}/p.png", f"{tmp}/p.jpg", tmp, "/proc/nope/x.png", "", "x.PNG"]),
             "--json": st.sampled_from([f"{tmp}/w.json", tmp, "/proc/nope/x.json", ""]),
             "--profile": st.text(max_size=8)}
    for f in draw(st.lists(st.sampled_from(sorted(flags)), max_size=4, unique=True)):
        argv.append(f"{f}={draw(flags[f])}")
    if draw(st.booleans()):
        argv.append("--no-progress")
    return argv


@settings(max_examples=fuzz_examples(200), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzz_flags(tmp_path, monkeypatch, data):
    """Flags only: the command is replaced by a recorder (a valid parse exits 0 without a server)."""
    from eagle3_capture.doctor import cli as dcli

    monkeypatch.setattr(dcli, "run_command", lambda args: print("parsed", args.doctor_command) or 0)
    argv = data.draw(watch_argv(str(tmp_path)))
    code, out, err = cli(*argv)
    assert code in (0, 2) and "Traceback" not in out + err, (argv, err)
    if code == 2:
        assert len(err.strip().splitlines()) == 1 and "error:" in err, (argv, err)
    else:
        assert out.startswith("parsed watch"), out


def test_the_watch_loads_neither_the_plugin_nor_torch(tmp_path):
    """A whole watch (plot included) in a fresh interpreter: the plugin, SGLang and torch stay unloaded (the watch
    sees the server only through its /metrics text)."""
    import subprocess
    import sys

    from doctor_helpers import REPO

    code = ("import sys\nfrom eagle3_capture.cli import main\n"
            "rc = main(sys.argv[1:])\n"
            "print('loaded', sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang') or "
            "m.startswith('eagle3_capture.sglang')))\nsys.exit(rc)\n")
    with MetricsServer([State([1, 1, 1, 1], **EXP), State([2, 2, 2, 2], **EXP)]) as s:
        p = subprocess.run([sys.executable, "-c", code, "doctor", "watch", "--server", s.url, *FAST, "--count", "1",
                            "--plot", str(tmp_path / "w.png")], capture_output=True, text=True, timeout=120,
                           cwd=REPO, env=dict(os.environ))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "loaded []" in p.stdout, p.stdout


def test_sigterm_ends_with_the_summary_and_the_series(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from doctor_helpers import REPO

    with MetricsServer([State([1, 1, 1, 1], **EXP), State([5, 5, 5, 5], **EXP)]) as s:
        p = subprocess.Popen([sys.executable, "-m", "eagle3_capture", "doctor", "watch", "--server", s.url, *FAST,
                              "--json", str(tmp_path / "w.json")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=REPO)
        deadline = time.monotonic() + 60
        while s.gets < 3 and time.monotonic() < deadline:  # a few readings in
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 0, out + err
    assert "stopped by Ctrl-C / SIGTERM" in out and "Traceback" not in err
    j = series(tmp_path / "w.json")
    assert j["ended"] == "interrupted" and j["refreshes"][1]["verifies"] == 20 - 4


def test_a_profile_for_other_flags_is_said(tmp_path):
    path = write_profile(tmp_path, hist=(10, 10, 10, 10, 10, 10), steps=5)
    code, out, err = watch([State([5, 5, 5, 5]), State([6, 6, 6, 6])], "--profile", path)
    assert code == 0, out + err
    assert "the server counts draft positions up to 3, the profile has 5" in out.split("watched ")[-1], out
