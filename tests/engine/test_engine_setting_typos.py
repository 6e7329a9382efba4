"""A misspelt safety setting on SGLang 0.5.23's real ``sglang.Engine`` (scheduler and detokenizer processes, the plugin
loaded by SGLang's own load_plugins() in each): ``EAGLE3_CAPTURE_PROFILE=good.json EAGLE3_CAPTURE_PROFILE_REQ=1`` was
read as a misspelt PROFILE, so the alarm's requirement was dropped and the engine served. It must stop at model load
with the one refusal line naming EAGLE3_CAPTURE_PROFILE_REQUIRED (one short engine start, which fails)."""
import os

import pytest

from engine_fixtures import CHAIN, doctor, flags_text, pair, serve_engine  # noqa: F401  (pair: a fixture)

pytestmark = [pytest.mark.engine, pytest.mark.sglang, pytest.mark.slow]


@pytest.fixture(scope="session")
def good_profile(pair):
    """A usable profile of the served flags (from `doctor accept --profile-out` on two prompts): the refusal is the
    misspelt name's, not the profile's."""
    path = os.path.join(pair.root, "typo_profile.json")
    code, text, err = doctor("accept", "--target", pair.target, "--draft", pair.draft, "--prompts",
                             pair.first_prompts(2), "--server-args", flags_text(CHAIN), "--new-tokens", 4,
                             "--profile-out", path, "--no-progress", "--device", "cpu", "--threads", 1)
    assert code == 0, text + err
    return path


def test_a_misspelt_profile_required_stops_the_engine_with_one_line(pair, good_profile):
    srv = serve_engine(pair, "profile_req_typo", pair.draft, prompts=pair.first_prompts(1), new_tokens=2,
                       env={"EAGLE3_CAPTURE_PROFILE": good_profile, "EAGLE3_CAPTURE_PROFILE_REQ": "1"})
    assert srv.error is not None and not srv.responses, srv.log[-3000:]
    line = ("eagle3_capture: refusing to serve: EAGLE3_CAPTURE_PROFILE_REQ='1' is not a setting of the plugin; it "
            "looks like a misspelt EAGLE3_CAPTURE_PROFILE_REQUIRED, which chooses whether the server may serve "
            "without a usable acceptance profile")
    assert line in srv.log, srv.log[-4000:]
    assert "Failed to execute general plugin" not in srv.log  # register() did not raise: no stock SGLang
    assert "RuntimeError: " + line in srv.log  # raised at model load, which stops the engine
