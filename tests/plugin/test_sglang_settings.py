"""Every plugin setting is validated when SGLang loads the plugin (switches.read_settings, plugin.register): a
malformed value never makes register() raise -- SGLang's load_plugins() would log a traceback and serve stock SGLang
without the plugin, the miswired capture this project exists to fix. It is either ignored with one ERROR line saying
what is ignored, the rest of the plugin on (the dump's settings), or the plugin refuses to serve with one line at
model load (EAGLE3_CAPTURE_DISABLE, EAGLE3_CAPTURE_SELFTEST). Through register() (a hypothesis fuzz over every
variable's value) and through SGLang's real load_plugins() (a fresh process, fuzzed values)."""
import json
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from scenarios import run_script
from sglang_fixtures import harness, plugin_env, require_sglang, sglang_plugin  # noqa: F401  (fixtures)

pytestmark = pytest.mark.sglang

ALARM_VARS = ["EAGLE3_CAPTURE_PROFILE", "EAGLE3_CAPTURE_PROFILE_REQUIRED", "EAGLE3_CAPTURE_ALARM_DROP",
              "EAGLE3_CAPTURE_ALARM_THRESHOLD"]
DUMP_VARS = ["EAGLE3_CAPTURE_DUMP_MAX", "EAGLE3_CAPTURE_DUMP_REQUESTS", "EAGLE3_CAPTURE_DUMP_TOKENS",
             "EAGLE3_CAPTURE_DUMP_BYTES", "EAGLE3_CAPTURE_DUMP_STREAM", "EAGLE3_CAPTURE_DUMP_STREAM_TOKENS"]


def test_each_setting_good_and_bad(tmp_path):
    from eagle3_capture.sglang.settings.switches import DumpSettings, read_settings

    d = str(tmp_path / "d")
    s = read_settings({})
    assert (s.disabled, s.selftest_raise, s.dump, s.errors, s.refusal) == (frozenset(), False, None, (), None)
    s = read_settings({"EAGLE3_CAPTURE_DUMP": d, "EAGLE3_CAPTURE_DUMP_MAX": " 3 ", "EAGLE3_CAPTURE_DUMP_BYTES": "2G",
                       "EAGLE3_CAPTURE_DUMP_STREAM": "ALL", "EAGLE3_CAPTURE_DUMP_STREAM_TOKENS": "0",
                       "EAGLE3_CAPTURE_DUMP_REQUESTS": "1", "EAGLE3_CAPTURE_DUMP_TOKENS": "100",
                       "EAGLE3_CAPTURE_SELFTEST": "Raise", "EAGLE3_CAPTURE_DISABLE": " Gather , draft_fc"})
    assert s.errors == () and s.refusal is None and s.selftest_raise and s.disabled == {"gather", "draft_fc"}
    assert s.dump == DumpSettings(d, 3, 1, 100, 2 << 30, "all", 0) and os.path.isdir(d)
    assert read_settings({"EAGLE3_CAPTURE_DUMP": d, "EAGLE3_CAPTURE_DUMP_BYTES": "512MiB"}).dump.max_bytes == 512 << 20
    # refusals: one line naming the variable, the value and what is expected
    s = read_settings({"EAGLE3_CAPTURE_DISABLE": "selftets", "EAGLE3_CAPTURE_DUMP": d})
    assert s.refusal.startswith("eagle3_capture: refusing to serve: EAGLE3_CAPTURE_DISABLE='selftets'")
    assert "\n" not in s.refusal and s.dump is not None  # the dump's own settings are fine
    s = read_settings({"EAGLE3_CAPTURE_SELFTEST": "rasie"})
    assert "EAGLE3_CAPTURE_SELFTEST='rasie': expected 'log' or 'raise'" in s.refusal


@pytest.mark.parametrize("name,value,says", [
    ("EAGLE3_CAPTURE_DUMP_MAX", "8k", "expected a non-negative integer"),
    ("EAGLE3_CAPTURE_DUMP_MAX", "-1", "expected a non-negative integer"),
    ("EAGLE3_CAPTURE_DUMP_MAX", "9" * 40, "expected a non-negative integer"),
    ("EAGLE3_CAPTURE_DUMP_REQUESTS", "1.5", "expected a non-negative integer"),
    ("EAGLE3_CAPTURE_DUMP_TOKENS", "", "expected a non-negative integer"),
    ("EAGLE3_CAPTURE_DUMP_BYTES", "4GB", "expected a size in bytes"),
    ("EAGLE3_CAPTURE_DUMP_BYTES", "4iB", "expected a size in bytes"),
    ("EAGLE3_CAPTURE_DUMP_STREAM", "every", "expected one of ['declared', 'all']"),
    ("EAGLE3_CAPTURE_DUMP_STREAM_TOKENS", "lots", "expected a non-negative integer"),
    ("EAGLE3_CAPTURE_DUMP_MAXX", "3", "EAGLE3_CAPTURE_DUMP_MAXX is not a setting of the plugin"),
])
def test_a_malformed_dump_setting_is_one_error_line_and_the_dump_is_off(tmp_path, name, value, says):
    from eagle3_capture.sglang.settings.switches import read_settings

    s = read_settings({"EAGLE3_CAPTURE_DUMP": str(tmp_path), name: value})
    assert s.dump is None and s.refusal is None and len(s.errors) == 1, s
    assert says in s.errors[0] and s.errors[0].startswith("eagle3_capture: ")
    assert s.errors[0].endswith("ignored: the capture dump is off in this process (the rest of the plugin is on)")
    s = read_settings({name: value})  # no dump asked for: still said, once
    assert len(s.errors) == 1 and "ignored (EAGLE3_CAPTURE_DUMP is not set: no dump)" in s.errors[0]


@pytest.mark.parametrize("name,value,closest,outcome", [
    ("EAGLE3_CAPTURE_SELFTST", "raise", "EAGLE3_CAPTURE_SELFTEST", "refused"),
    ("EAGLE3_CAPTURE_SELF_TEST", "raise", "EAGLE3_CAPTURE_SELFTEST", "refused"),
    ("eagle3_capture_selftest", "raise", "EAGLE3_CAPTURE_SELFTEST", "refused"),
    ("EAGLE3_CAPTURE_DISABLED", "all", "EAGLE3_CAPTURE_DISABLE", "refused"),
    ("EAGLE3_CAPTURE_DISBALE", "selftest", "EAGLE3_CAPTURE_DISABLE", "refused"),
    ("EAGLE3CAPTURE_DISABLE", "taps", "EAGLE3_CAPTURE_DISABLE", "refused"),
    ("EAGLE3_CAPTURE_DUMPDIR", "/tmp/x", "EAGLE3_CAPTURE_DUMP", "dump off"),
    ("EAGLE3_CAPTURE_DUMP_DIR", "/tmp/x", "EAGLE3_CAPTURE_DUMP", "dump off"),
    ("EAGLE3_CAPTURE_DUMPMAX", "3", "EAGLE3_CAPTURE_DUMP_MAX", "dump off"),
    ("EAGLE3_CAPTURE_GATHER_BACKEN", "nccl", "EAGLE3_CAPTURE_GATHER_BACKEND", "ignored"),
    ("EAGLE3_CAPTURE_ENABLE", "0", "EAGLE3_CAPTURE_DISABLE", "ignored"),
    # issue 42: a near-miss of a guard refuses even where another setting is a shade closer, naming the guard meant
    ("EAGLE3_CAPTURE_PROFILE_REQ", "1", "EAGLE3_CAPTURE_PROFILE_REQUIRED", "refused"),
    ("EAGLE3_CAPTURE_REQUIRED_PROFILE", "1", "EAGLE3_CAPTURE_PROFILE_REQUIRED", "refused"),
    ("EAGLE3_CAPTURE_REQ_PROFILE", "1", "EAGLE3_CAPTURE_PROFILE_REQUIRED", "refused"),
    ("EAGLE3_CAPTURE_PROFILE_REQUIRE", "1", "EAGLE3_CAPTURE_PROFILE_REQUIRED", "refused"),
    ("EAGLE3_CAPTURE_TEST_SELF", "raise", "EAGLE3_CAPTURE_SELFTEST", "refused"),
    ("EAGLE3_CAPTURE_DISABL", "taps", "EAGLE3_CAPTURE_DISABLE", "refused"),
    ("EAGLE3_CAPTURE_SELFTEST_EVERYY", "5", "EAGLE3_CAPTURE_SELFTEST_EVERY", "ignored"),  # clearly another setting's
    ("EAGLE3_CAPTURE_PROFILE_PATH", "/p.json", "EAGLE3_CAPTURE_PROFILE", "alarm off"),
])
def test_a_misspelt_name_is_one_line_naming_the_closest_and_a_guards_refuses(tmp_path, name, value, closest,
                                                                             outcome):
    """Issue 32, kind 6: a name that looks like the package's but is none of its variables was ignored without a
    word (only EAGLE3_CAPTURE_DUMP_* names were checked): a misspelt EAGLE3_CAPTURE_SELFTEST=raise logged a broken
    capture instead of stopping the server."""
    from eagle3_capture.sglang.settings.switches import read_settings

    d = str(tmp_path / "d")
    s = read_settings({"EAGLE3_CAPTURE_DUMP": d, name: value})
    if outcome == "refused":
        assert s.refusal is not None and s.errors == (), s
        assert s.refusal.startswith(f"eagle3_capture: refusing to serve: {name}={value!r} is not a setting of the "
                                    f"plugin; it looks like a misspelt {closest}, which ")
        assert "\n" not in s.refusal
        return
    assert s.refusal is None and len(s.errors) == 1, s
    assert name in s.errors[0] and f"closest known name: {closest}" in s.errors[0] and "\n" not in s.errors[0]
    if outcome == "dump off":  # a dump setting misspelt: no dump rather than one bounded otherwise than asked
        assert s.dump is None and s.errors[0].endswith("ignored: the capture dump is off in this process (the "
                                                       "rest of the plugin is on)")
    elif outcome == "alarm off":
        assert s.alarm.drift is None and "the acceptance alarm is off" in s.errors[0]
    else:
        assert s.dump is not None and s.errors[0].endswith("; ignored")


def test_a_name_equally_near_two_known_names_is_refused():
    """Which of two equally near settings was meant cannot be told: reading it as either (or neither) guesses."""
    from eagle3_capture.sglang.settings.switches import read_settings

    s = read_settings({"EAGLE3_CAPTURE_GATHER": "1"})
    assert s.refusal is not None and "\n" not in s.refusal, s
    assert ("EAGLE3_CAPTURE_GATHER='1' is not a setting of the plugin and is exactly as near to "
            "EAGLE3_CAPTURE_GATHER_SIGNAL as to EAGLE3_CAPTURE_GATHER_BLOCKS") in s.refusal


def _near_misses(name: str):
    """Typos of a setting's name: a letter dropped, doubled or swapped with the next, the words reordered, a word
    cut to its first letters, separators changed, lower case."""
    tail = name[len("EAGLE3_CAPTURE_"):]
    words = tail.split("_")
    letters = st.integers(0, len(tail) - 1)
    dropped = letters.map(lambda i: tail[:i] + tail[i + 1:])
    doubled = letters.map(lambda i: tail[:i] + tail[i] + tail[i:])
    swapped = st.integers(0, len(tail) - 2).map(lambda i: tail[:i] + tail[i + 1] + tail[i] + tail[i + 2:])
    reordered = st.permutations(words).map("_".join)
    cut = st.integers(0, len(words) - 1).flatmap(
        lambda i: st.integers(3, max(3, len(words[i]) - 1)).map(
            lambda n: "_".join(w[:n] if j == i else w for j, w in enumerate(words))))
    typo = st.one_of(dropped, doubled, swapped, reordered, cut)
    prefix = st.sampled_from(["EAGLE3_CAPTURE_", "eagle3_capture_", "EAGLE3CAPTURE_", "EAGLE3_CAPTURE__"])
    return st.tuples(prefix, typo).map("".join)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_fuzz_a_near_miss_of_a_guard_refuses_naming_it(data):
    """Issue 42: any near-miss of a safety setting (every name of switches.GUARDS) refuses, naming the intended
    name; ``EAGLE3_CAPTURE_PROFILE_REQ=1`` was read as a misspelt PROFILE: the alarm off, the server serving."""
    from eagle3_capture.sglang.settings.switches import GUARDS, SETTINGS, read_settings

    guard = data.draw(st.sampled_from(sorted(GUARDS)))
    name = data.draw(_near_misses(guard))
    if name in SETTINGS:  # a typo that spells another setting (or the guard itself) is that setting
        return
    s = read_settings({name: "1"})
    assert s.refusal is not None, (name, s)
    assert f"looks like a misspelt {guard}," in s.refusal and "\n" not in s.refusal, s.refusal


@settings(max_examples=200, deadline=None)
@given(name=st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ_0123456789", min_size=1, max_size=30)
       .map(lambda t: "EAGLE3_CAPTURE_" + t))
def test_fuzz_an_unknown_name_is_never_silent(name):
    """Every name that looks like the package's and is not one of its variables is either refused or said in one
    ERROR line naming the closest known name; nothing is read silently."""
    from eagle3_capture.sglang.settings.typos import OTHER_VARIABLES
    from eagle3_capture.sglang.settings.switches import SETTINGS, read_settings

    if name in SETTINGS or name in OTHER_VARIABLES:
        return
    s = read_settings({name: "1"}, prepare_dir=False)
    if s.refusal is not None:
        assert name in s.refusal and s.errors == (), s
    else:
        assert len(s.errors) == 1 and name in s.errors[0] and "\n" not in s.errors[0], s


def test_the_packages_other_variables_are_known():
    """Every EAGLE3_CAPTURE_* name the package or its build reads (a string in its code, docstrings aside: they
    quote misspelt names) is a known one: none of them is ever reported, let alone refused, as a misspelt
    setting."""
    import ast
    import re

    from eagle3_capture.sglang.settings.typos import OTHER_VARIABLES
    from eagle3_capture.sglang.settings.switches import SETTINGS, read_settings

    def names(path):
        tree = ast.parse(open(path).read())
        docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef,
                                                                               ast.FunctionDef))
                and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        return {m for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                and id(n) not in docs for m in re.findall(r"EAGLE3_CAPTURE_[A-Z0-9_]*[A-Z0-9]", n.value)}

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found = names(os.path.join(repo, "setup.py"))
    for root, _, files in os.walk(os.path.join(repo, "python", "eagle3_capture")):
        found |= {m for f in files if f.endswith(".py") for m in names(os.path.join(root, f))}
    assert found == set(SETTINGS) | set(OTHER_VARIABLES), found ^ (set(SETTINGS) | set(OTHER_VARIABLES))
    s = read_settings({v: "1" for v in OTHER_VARIABLES})
    assert s.errors == () and s.refusal is None


def test_a_dump_directory_that_cannot_be_used(tmp_path):
    from eagle3_capture.sglang.settings.switches import read_settings

    f = tmp_path / "file"
    f.write_text("x")
    for value, says in ((str(f), "exists and is not a directory"), (str(f / "sub"), "cannot be written"),
                        ("/proc/eagle3_capture_dump", "cannot be written")):
        s = read_settings({"EAGLE3_CAPTURE_DUMP": value})
        assert s.dump is None and len(s.errors) == 1 and says in s.errors[0], (value, s.errors)
    assert read_settings({"EAGLE3_CAPTURE_DUMP": "  "}).errors == ()  # blank: no dump, nothing to say


# ----------------------------------------------------------------------------------------------------------------
# through register(): what it registers and says, for any value of any variable
# ----------------------------------------------------------------------------------------------------------------

@pytest.fixture
def spy(sglang_plugin, monkeypatch):
    """register() with SGLang's HookRegistry.register recorded instead of applied, and the plugin's lines kept."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    from eagle3_capture.sglang.settings import switches

    calls, lines = [], []
    monkeypatch.setattr(HookRegistry, "register", classmethod(lambda cls, path, fn, kind: calls.append(path)))
    monkeypatch.setattr(switches, "announce", lambda level, msg: lines.append((level, msg)))
    registered, skipped = dict(sglang_plugin.registered), dict(sglang_plugin.skipped)
    saved = {k: v for k, v in os.environ.items() if k.startswith("EAGLE3_CAPTURE_")}

    def run(env):
        calls.clear(), lines.clear()
        for k in [k for k in os.environ if k.startswith("EAGLE3_CAPTURE_")]:
            del os.environ[k]
        os.environ.update(env)
        sglang_plugin.register()  # must not raise, whatever the values
        return list(calls), list(lines)

    yield run
    for k in [k for k in os.environ if k.startswith("EAGLE3_CAPTURE_")]:
        del os.environ[k]
    os.environ.update(saved)
    switches.configure()
    sglang_plugin.registered.clear(), sglang_plugin.registered.update(registered)
    sglang_plugin.skipped.clear(), sglang_plugin.skipped.update(skipped)


def _check_outcome(plugin, env, calls, lines):
    """The promise, for one environment: a refusal registers only the model-load hook and says one line; otherwise
    the hooks are registered, one ERROR line per ignored setting, and the dump's hooks only with a valid dump."""
    from eagle3_capture.sglang.settings.switches import read_settings

    s = read_settings(env)
    errors = [m for lv, m in lines if lv == "error"]
    if s.refusal is not None:
        assert calls == [plugin.LOAD_MODEL_PATH] and errors == list(s.errors) + [s.refusal]
        return "refused"
    assert errors == list(s.errors)
    if s.all_off:
        assert calls == []
        return "clean"
    assert "sglang.srt.models.deepseek_v2.DeepseekV2ForCausalLM.set_eagle3_layers_to_capture" in calls or \
        "taps" in s.disabled
    from eagle3_capture.sglang.installed import internals

    assert (internals.current().graph_gate_paths[0] in calls) == (s.dump is not None)
    return "ignored" if errors else "clean"


SAFE_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=24)
VALUE = st.one_of(SAFE_TEXT, st.integers(-10 ** 15, 10 ** 15).map(str),
                  st.sampled_from(["", " ", "all", "taps", "log", "raise", "declared", "4G", "0", "8", "1e3",
                                   "selftest,taps", "ALL", "gather,", "1_000"]))


def test_disable_all_turns_the_dump_off_too_and_says_so_in_the_one_startup_line(sglang_plugin, spy, tmp_path):
    """Issue 32, kind 6: EAGLE3_CAPTURE_DISABLE=all with EAGLE3_CAPTURE_DUMP=dir still registered the dump's 9 hooks
    (and created the directory), though `all` means the whole plugin."""
    d = tmp_path / "dump"
    calls, lines = spy({"EAGLE3_CAPTURE_DISABLE": "all", "EAGLE3_CAPTURE_DUMP": str(d)})
    assert calls == [] and not d.exists(), calls
    assert len(lines) == 1 and lines[0][0] == "warning", lines
    assert "every hook off (EAGLE3_CAPTURE_DISABLE=all): stock SGLang serves" in lines[0][1]
    assert f"EAGLE3_CAPTURE_DUMP={str(d)!r} is not used either" in lines[0][1]
    assert sglang_plugin.registered == {} and "EAGLE3_CAPTURE_DISABLE=all" in sglang_plugin.skipped["dump"]
    # without the dump: the one startup line as before; every hook named (not `all`) with the dump: the dump serves
    calls, lines = spy({"EAGLE3_CAPTURE_DISABLE": "all"})
    assert calls == [] and [lv for lv, _ in lines] == ["info"] and "is not used" not in lines[0][1]
    calls, lines = spy({"EAGLE3_CAPTURE_DISABLE": "taps,final_boundary,capture,draft_fc,gather,selftest,acceptance",
                        "EAGLE3_CAPTURE_DUMP": str(d)})
    assert sorted(sglang_plugin.registered) == ["dump"] and d.is_dir()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(name=st.sampled_from(["EAGLE3_CAPTURE_DISABLE", "EAGLE3_CAPTURE_SELFTEST"] + DUMP_VARS + ALARM_VARS),
       value=VALUE)
def test_fuzz_register_never_raises_and_keeps_its_promise(sglang_plugin, spy, tmp_path, name, value):
    env = {"EAGLE3_CAPTURE_DUMP": str(tmp_path / "dump"), name: value}
    calls, lines = spy(env)
    outcome = _check_outcome(sglang_plugin, env, calls, lines)
    if name in DUMP_VARS or name in ALARM_VARS[:1] + ALARM_VARS[2:]:
        assert outcome != "refused"  # only EAGLE3_CAPTURE_PROFILE_REQUIRED guards a choice


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sub=SAFE_TEXT.filter(lambda t: "/" not in t and t not in ("", ".", "..")))
def test_fuzz_the_dump_directory(sglang_plugin, spy, tmp_path, sub):
    env = {"EAGLE3_CAPTURE_DUMP": str(tmp_path / "d" / sub)}
    calls, lines = spy(env)
    assert _check_outcome(sglang_plugin, env, calls, lines) != "refused"


# ----------------------------------------------------------------------------------------------------------------
# through SGLang's real load_plugins()
# ----------------------------------------------------------------------------------------------------------------

def _fuzzed_cases(tmp_path, n=6, seed=1234):
    rng = random.Random(seed)
    pool = ["", " ", "0", "3", "-1", "1e3", "4G", "4GB", "7 K", "0x10", "all", "taps,capure", "raise", "RAISE",
            "yes", "declared", "every", "ü", "\t", "9" * 30, "selftest , gather"]

    def junk():
        return "".join(rng.choice("abcXYZ019 ,._-/ü€\t") for _ in range(rng.randint(0, 10)))

    cases = [{}, {"EAGLE3_CAPTURE_DISABLE": "selftets"}, {"EAGLE3_CAPTURE_SELFTEST": "on"},
             {"EAGLE3_CAPTURE_SELFTST": "raise"}, {"EAGLE3_CAPTURE_DISABLED": "all"},
             {"EAGLE3_CAPTURE_DUMPDIR": str(tmp_path / "typo")},
             {"EAGLE3_CAPTURE_DISABLE": "all", "EAGLE3_CAPTURE_DUMP": str(tmp_path / "off")},
             {"EAGLE3_CAPTURE_DUMP": str(tmp_path / "ok")},
             {"EAGLE3_CAPTURE_DUMP": str(tmp_path / "ok"), "EAGLE3_CAPTURE_DUMP_MAX": "lots"},
             {"EAGLE3_CAPTURE_DUMP": str(tmp_path / "file")},
             {"EAGLE3_CAPTURE_PROFILE": str(tmp_path / "good.json"), "EAGLE3_CAPTURE_PROFILE_REQ": "1"},
             {"EAGLE3_CAPTURE_PROFILE": str(tmp_path / "good.json"), "EAGLE3_CAPTURE_REQUIRED_PROFILE": "1"}]
    (tmp_path / "file").write_text("x")
    for name in ["EAGLE3_CAPTURE_DISABLE", "EAGLE3_CAPTURE_SELFTEST"] + DUMP_VARS:
        for _ in range(n):
            cases.append({"EAGLE3_CAPTURE_DUMP": str(tmp_path / "ok"),
                          name: rng.choice(pool) if rng.random() < 0.6 else junk()})
    return cases


def test_load_plugins_fuzzed_settings_never_serve_stock_silently(harness, tmp_path):
    from eagle3_capture.sglang.settings.switches import read_settings

    cases = _fuzzed_cases(tmp_path)
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    out = tmp_path / "results.json"
    run_script("settings", out, args=[path], timeout=600)
    results = json.loads(out.read_text())
    assert len(results) == len(cases)
    seen = set()
    for r in results:
        s = read_settings(r["env"])
        assert r["executed"] and not r["plugin_failed"], r  # register() never raised in load_plugins()
        if s.refusal is not None:
            seen.add("refused")
            assert r["load"] == s.refusal and r["registered"] == ["refusal"], r  # the model load stops, one line
            assert s.refusal in r["errors"]
        elif s.all_off:
            assert r["load"].startswith("went ahead") and r["registered"] == [] and not r["dump"], r
        else:
            seen.add("ignored" if s.errors else "clean")
            assert r["load"].startswith("went ahead"), r
            assert "taps" in r["registered"] and ("dump" in r["registered"]) == (s.dump is not None), r
            assert [e for e in r["errors"] if e in s.errors] == list(s.errors), r
    assert seen == {"refused", "ignored", "clean"}, seen
    # issue 32, kind 6, through SGLang's own load_plugins(): a misspelt guard stops the model load with its line, a
    # misspelt dump directory is one ERROR line naming EAGLE3_CAPTURE_DUMP, `all` registers nothing
    by_env = {json.dumps(r["env"], sort_keys=True): r for r in results}

    def result(env):
        return by_env[json.dumps(env, sort_keys=True)]

    good = str(tmp_path / "good.json")
    for env, closest in (({"EAGLE3_CAPTURE_SELFTST": "raise"}, "EAGLE3_CAPTURE_SELFTEST"),
                         ({"EAGLE3_CAPTURE_DISABLED": "all"}, "EAGLE3_CAPTURE_DISABLE"),
                         # issue 42: read as a misspelt PROFILE, these served without the alarm they asked for
                         ({"EAGLE3_CAPTURE_PROFILE": good, "EAGLE3_CAPTURE_PROFILE_REQ": "1"},
                          "EAGLE3_CAPTURE_PROFILE_REQUIRED"),
                         ({"EAGLE3_CAPTURE_PROFILE": good, "EAGLE3_CAPTURE_REQUIRED_PROFILE": "1"},
                          "EAGLE3_CAPTURE_PROFILE_REQUIRED")):
        r = result(env)
        assert r["registered"] == ["refusal"] and f"looks like a misspelt {closest}" in r["load"], r
    r = result({"EAGLE3_CAPTURE_DUMPDIR": str(tmp_path / "typo")})
    assert r["load"].startswith("went ahead") and len(r["errors"]) == 1, r
    assert "closest known name: EAGLE3_CAPTURE_DUMP" in r["errors"][0]
    r = result({"EAGLE3_CAPTURE_DISABLE": "all", "EAGLE3_CAPTURE_DUMP": str(tmp_path / "off")})
    assert r["registered"] == [] and not (tmp_path / "off").exists(), r
