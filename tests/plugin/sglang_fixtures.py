"""Fixtures of the SGLang plugin tests, imported by each test module (`from sglang_fixtures import ...`).

(Not a conftest.py: pytest imports every directory's conftest.py as the module `conftest`, and the last one
imported would shadow tests/conftest.py for the modules that do `from conftest import ...`.)

- Every test module here is marked `sglang`, and its tests FAIL, never skip, when SGLang is missing or is not a
  release of the range the plugin supports (0.5.12-0.5.23): deselect them with `-m "not sglang"` where it is not
  installed (e.g. the GPU machine, which runs only test_hook_calls_cuda.py's `cuda` tests, which need no SGLang).
  Any release of the range runs them: the installed one, or one put first on PYTHONPATH (`make test-sglang
  SGLANG=X`, or tests/sglang_release_dirs.py sglang --importable X; the session header names the release under
  test). harness.py adapts to the
  release by what it has; a test that cannot run on a release skips with the release and the missing SGLang
  feature as its reason.
- The in-process tests run with the plugin loaded through SGLang's own `load_plugins()` (once per process, and
  SGLang cannot undo it); what needs a process without the plugin, or another environment, runs in a subprocess
  (scenarios.py).
- SGLang's real model code runs on the CPU as harness.py sets it up (gloo parallel state, SGLang's ForwardBatch kit).
"""
import importlib.metadata
import importlib.util
import os

import pytest

from conftest import sglang_under_test  # tests/conftest.py: also the session header's line

HERE = os.path.dirname(os.path.abspath(__file__))

# Before anything imports torch._dynamo users (SGLang's MoE top-k is torch.compile'd; on CPU that is slow).
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

# The range the plugin supports: the plugin's own (eagle3_capture/sglang/installed/internals.py: OLDEST, NEWEST).
from eagle3_capture.sglang.installed.internals import NEWEST as SGLANG_NEWEST  # noqa: E402
from eagle3_capture.sglang.installed.internals import OLDEST as SGLANG_OLDEST  # noqa: E402
from eagle3_capture.sglang.installed.internals import range_text  # noqa: E402

SGLANG_RANGE = range_text()


def _sglang_problem():
    found = sglang_under_test()
    if found is None:
        return "sglang is not installed (or has no distribution metadata)"
    if "metadata at" in found[0]:
        return f"sglang's metadata and package disagree: {found[0]}"
    from eagle3_capture.sglang.installed.internals import version_tuple

    v = version_tuple(found[0])
    if v is None or not (SGLANG_OLDEST <= v[:3] <= SGLANG_NEWEST):
        return f"these tests cover sglang {SGLANG_RANGE}, found {found[0]}"
    return None


@pytest.fixture(autouse=True)
def require_sglang():
    why = _sglang_problem()
    if why is not None:
        pytest.fail(f"this test is marked `sglang`: {why} (install 0.5.23 with `make test`, or run another release "
                    "with `make test-sglang SGLANG=X`; deselect with -m 'not sglang')")


def skip_unless_sglang_has(module: str, what: str) -> None:
    """Skip the calling test where the SGLang under test has no `module` (its subject, `what`, is absent in that
    release): the reason names the release and the feature."""
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        found = False
    if not found:
        import harness as h

        h.skip_missing_feature(what)


@pytest.fixture(scope="session")
def harness():
    import harness as h

    h.setup_process()
    return h


@pytest.fixture(scope="session")
def sglang_plugin(harness):
    """The plugin loaded through SGLang's own load_plugins(), from the installed entry point."""
    eps = [ep for ep in importlib.metadata.entry_points(group="sglang.srt.plugins") if ep.name == "eagle3_capture"]
    assert eps, ("entry point eagle3_capture not installed in group sglang.srt.plugins: "
                 "run `pip install --no-build-isolation --no-deps -e .` in the repository")
    assert eps[0].value == "eagle3_capture.sglang.plugin:register", eps[0].value
    import sglang.srt.plugins as sp

    sp.load_plugins()
    from eagle3_capture.sglang import plugin

    return plugin


@pytest.fixture(scope="session")
def tiny(harness, sglang_plugin):
    """A seeded tiny DeepseekV3: the HF model, SGLang's model loaded from its weights (plugin installed), and the
    HF reference hidden states at every tap for PROMPT + [DECODE_TOKEN] (built once per process)."""
    return harness.tiny_target()


@pytest.fixture
def plugin_env():
    """Set the plugin's settings for one test: ``plugin_env(EAGLE3_CAPTURE_DUMP=..., ...)`` sets the variables (None
    unsets one) and validates them as registration does (``switches.configure()``: the hooks read the settings
    validated then, never the environment); the dump's budgets start afresh. Restored after the test."""
    from eagle3_capture.sglang.dump import forwards as dump
    from eagle3_capture.sglang.settings import switches

    saved = {}

    def apply(**env):
        for k, v in env.items():
            saved.setdefault(k, os.environ.get(k))
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        dump.reset()
        return switches.configure()

    yield apply
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    dump.reset()
    switches.configure()


from collections import Counter  # noqa: E402  (after the environment set-up above)

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402


class OpCounter(TorchDispatchMode):
    """Counts the ops dispatched inside its context (to assert which kernels a hooked forward ran)."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[str(func)] += 1
        return func(*args, **(kwargs or {}))
