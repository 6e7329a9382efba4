"""What the doctor CLI's fuzz tests share (test_doctor_cli_fuzz.py: flags, configs and tensor files;
test_doctor_run_fuzz.py: prompts, recorded responses and runs): the hypothesis settings, the CLI run that fails a test
on a traceback or an exit 2 of more than one line, a scratch folder, and the strategies for JSON values, text and
server flags."""
from __future__ import annotations

import contextlib
import json
import os
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from conftest import fuzz_examples
from doctor_helpers import cli


def fuzz(n: int) -> settings:
    return settings(max_examples=fuzz_examples(n), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


def run_cli(*argv):
    """(code, stdout, stderr), failing the test on an exception out of the CLI or a traceback in its output."""
    try:
        code, out, err = cli(*argv)
    except BaseException as e:  # anything but SystemExit escaping main() is the bug the fuzz looks for
        pytest.fail(f"eagle3-capture {' '.join(map(str, argv))[:300]} raised {type(e).__name__}: {e}")
    assert code in (0, 1, 2), (code, argv, err[-500:])
    assert "Traceback" not in err and "Traceback" not in out, err[-2000:]
    if code == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert lines and "error:" in lines[-1], err
        assert len(lines) == 1, f"exit 2 with {len(lines)} lines on stderr:\n{err}"
    return code, out, err


@contextlib.contextmanager
def scratch_dir():
    """A scratch folder holding a folder and a small JSON file (the paths the fuzz mixes into flags)."""
    with tempfile.TemporaryDirectory(prefix="e3fuzz_") as d:
        os.makedirs(os.path.join(d, "adir"))
        with open(os.path.join(d, "afile.json"), "w") as f:
            json.dump([[1, 2, 3, 4]], f)
        yield d


TEXT = st.text(min_size=0, max_size=12)
JSON_VALUE = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 40, 2 ** 40) |
                          st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
                          lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                      max_size=3), max_leaves=8)
SERVER_ARGS = st.one_of(TEXT, st.lists(st.sampled_from(
    ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "--speculative-eagle-topk",
     "--speculative-num-draft-tokens", "--tp", "--pp-size", "--page-size", "--enable-two-batch-overlap",
     "--enable-dp-attention", "--dp-size", "--attn-dp-size", "--attention-backend", "fa3", "0", "-1", "3", "1",
     "x", "--speculative-adaptive=maybe", "'", "--tp=2"]), max_size=10).map(" ".join))

