"""engine_runs.Runs, the engine tests' scheduler of server runs (no server here: runs are short functions): each
run once, never more than `parallel` at a time, prerequisites first, by priority among those ready, and a failure
raised in every reader."""
import threading
import time

import pytest

from engine_runs import Runs, run_fixture


class Log:
    def __init__(self):
        self.lock = threading.Lock()
        self.events = []
        self.active = 0
        self.most = 0

    def run(self, name, seconds=0.05, result=None):
        def fn(*deps):
            with self.lock:
                self.events.append(("start", name, deps))
                self.active += 1
                self.most = max(self.most, self.active)
            time.sleep(seconds)
            with self.lock:
                self.active -= 1
                self.events.append(("end", name))
            return result if result is not None else name
        return fn

    def starts(self):
        return [e[1] for e in self.events if e[0] == "start"]


def test_each_run_once_at_most_parallel_at_a_time_by_priority():
    log, runs = Log(), Runs(2)
    for i, name in enumerate(["a", "b", "c", "d", "e"]):
        runs.add(name, log.run(name), priority=10 - i)   # e first, a last
    runs.want(["a", "b", "c", "d", "e"])
    assert [runs.get(n) for n in "abcde"] == list("abcde")
    assert runs.get("c") == "c"
    runs.close()
    assert sorted(log.starts()) == list("abcde") and log.most == 2
    assert log.starts()[:2] in (["e", "d"], ["d", "e"]) and log.starts()[-1] == "a"


def test_prerequisites_first_and_their_results_passed_in():
    log, runs = Log(), Runs(2)
    runs.add("profile", log.run("profile", 0.2, result="P"), priority=0)
    runs.add("launched", log.run("launched", result="L"), needs=["profile"], priority=1)
    runs.add("other", log.run("other", 0.3), priority=5)
    runs.want(["launched", "other"])   # profile is wanted through launched
    assert runs.get("launched") == "L"
    runs.close()
    start = {e[1]: (i, e[2]) for i, e in enumerate(log.events) if e[0] == "start"}
    end = {e[1]: i for i, e in enumerate(log.events) if e[0] == "end"}
    assert start["launched"][1] == ("P",) and start["launched"][0] > end["profile"]
    assert runs.seconds().keys() == {"profile", "launched", "other"}


def test_a_failed_run_is_every_readers_error_and_its_dependents_fail_with_it():
    runs = Runs(1)

    def boom():
        raise RuntimeError("the server did not start")

    runs.add("server", boom)
    runs.add("after", lambda s: s, needs=["server"])
    runs.want(["after"])
    for name in ("server", "server", "after"):
        with pytest.raises(RuntimeError, match="the server did not start"):
            runs.get(name)
    runs.close()


def test_one_at_a_time_and_bad_settings():
    log, runs = Log(), Runs(1)
    for name in "xyz":
        runs.add(name, log.run(name))
    assert [runs.get(n) for n in "zyx"] == list("zyx")
    runs.close()
    assert log.most == 1
    with pytest.raises(ValueError, match="E3_ENGINE_PARALLEL must be >= 1"):
        Runs(0)
    with pytest.raises(ValueError, match="added twice"):
        r = Runs(1)
        r.add("a", lambda: 1)
        r.add("a", lambda: 2)
    with pytest.raises(KeyError, match="no run named 'nope'"):
        Runs(1).want(["nope"])


def test_the_parallel_setting_is_read_and_checked(monkeypatch):
    monkeypatch.setenv("E3_ENGINE_PARALLEL", "3")
    assert Runs.from_env().parallel == 3
    monkeypatch.setenv("E3_ENGINE_PARALLEL", "two")
    with pytest.raises(ValueError, match="E3_ENGINE_PARALLEL must be an integer >= 1, got 'two'"):
        Runs.from_env()


def test_a_run_fixture_is_tagged_with_its_run():
    from engine_runs import RUN_TAG

    fx = run_fixture("launched", lambda runs, pair: None)
    assert getattr(fx, RUN_TAG) == "launched"
