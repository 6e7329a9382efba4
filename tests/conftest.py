"""Shared test setup.

- Tests marked `cuda` need a GPU: on a machine without one they FAIL (never skip), so deselect them there with
  `-m "not cuda"` (what `make test` does) and run them on the GPU machine with `-m cuda`.
- Tests marked `cuda_build` need the extension built with CUDA, not a GPU: `make test` deselects them only when the
  build is CPU-only.
- The session header names the SGLang release the `sglang` / `engine` tests run against (any of 0.5.12-0.5.23: the
  environment's, or one put first on PYTHONPATH by `make test-sglang SGLANG=X`) and the transformers beside it.
- Hypothesis profiles: "ci" (default; the fuzz tests ask for their own example counts) and "sanitizer" (few
  examples, for runs under compute-sanitizer): select with E3_HYPOTHESIS_PROFILE.
"""
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=False)
settings.register_profile("sanitizer", deadline=None, max_examples=25,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
settings.load_profile(os.environ.get("E3_HYPOTHESIS_PROFILE", "ci"))

def _distribution(name: str):
    import importlib.metadata

    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def sglang_under_test():
    """(version, directory) of the SGLang this process imports, or None where it is not installed. The metadata
    found first on sys.path (a release directory first on PYTHONPATH wins over the environment's), checked to be
    the package that imports: never an import of sglang itself (heavy, and it would fix the release for the run)."""
    import importlib.util

    # a folder named sglang on sys.path would make a namespace package (no origin): only the real, regular
    # package counts
    try:
        spec = importlib.util.find_spec("sglang")
        if spec is None or spec.origin is None or importlib.util.find_spec("sglang.srt") is None:
            return None
    except ModuleNotFoundError:
        return None
    dist = _distribution("sglang")
    if dist is None:
        return None
    where = os.path.dirname(os.path.dirname(os.path.abspath(spec.origin)))
    if os.path.abspath(str(dist.locate_file(""))) != where:
        return f"{dist.version} (metadata at {dist.locate_file('')}, package at {where})", where
    return dist.version, where


def pytest_report_header(config):
    found = sglang_under_test()
    if found is None:
        return "sglang: not installed (the `sglang` and `engine` tests need it)"
    tf = _distribution("transformers")
    return (f"sglang under test: {found[0]} from {found[1]}"
            + (f"; transformers {tf.version} from {tf.locate_file('')}" if tf is not None else ""))


DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]

# A folder the whole run shares, pytest-xdist workers included (made by the controlling process, which the workers'
# environment comes from; removed when the run ends): what is expensive to build and the same in every worker is
# built once there (doctor_helpers.demo_fast: the trained demo pair).
SHARED_DIR = "E3_TEST_SHARED_DIR"


def pytest_configure(config):
    if hasattr(config, "workerinput") or os.environ.get(SHARED_DIR):  # an xdist worker, or the caller chose one
        return
    import tempfile

    os.environ[SHARED_DIR] = tempfile.mkdtemp(prefix="e3-tests-shared-")
    config._e3_shared_dir = os.environ[SHARED_DIR]


def pytest_unconfigure(config):
    made = getattr(config, "_e3_shared_dir", None)
    if made is not None:
        import shutil

        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop(SHARED_DIR, None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """E3_FAIL_ON_SKIP=1 (make test-releases): a skip is a failure, so a release whose code was not installed can
    never pass as skipped."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("E3_FAIL_ON_SKIP") == "1" and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under E3_FAIL_ON_SKIP=1: {report.longrepr}"


def pytest_runtest_setup(item):
    if item.get_closest_marker("cuda") is not None and not torch.cuda.is_available():
        pytest.fail("this test is marked `cuda` and needs a GPU; deselect it with -m 'not cuda' on a CPU machine")
    if item.get_closest_marker("cuda_build") is not None:
        import eagle3_capture

        if "cuda" not in eagle3_capture.build_info()["backends"]:
            pytest.fail("this test is marked `cuda_build` and needs the extension built with CUDA (no GPU needed); "
                        "deselect it with -m 'not cuda_build' for a CPU-only build")


def fuzz_examples(n: int) -> int:
    """Example count for a fuzz test: n normally, fewer under the sanitizer profile."""
    return min(n, 25) if os.environ.get("E3_HYPOTHESIS_PROFILE") == "sanitizer" else n
