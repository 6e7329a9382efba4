"""End to end with SGLang's real model code: the plugin's capture dump (EAGLE3_CAPTURE_DUMP) of SGLang 0.5.23's
DeepseekV3 prefill, served through SGLang's ModelRunner.forward, fingerprinted by the doctor against a reference the
doctor dumped from the transformers model with the same weights. Reuses the SGLang tests' CPU harness
(tests/plugin/harness.py) and fixtures."""

import pytest
import torch

from sglang_fixtures import harness, plugin_env, require_sglang, sglang_plugin, tiny  # noqa: F401  (fixtures)

pytestmark = pytest.mark.sglang

DECLARED = [-1, 1, 3, 5]  # embedding, two middle layers and the final boundary of the 6-layer tiny model


def test_plugin_dump_fingerprints_as_the_declared_taps(harness, tiny, sglang_plugin, tmp_path, plugin_env):
    from eagle3_capture.doctor.fingerprint.reference import fingerprint, render
    from eagle3_capture.doctor.fingerprint.reference_dump import reference_tensors, write_reference
    from eagle3_capture.doctor.target_side.model import Target
    from eagle3_capture.sglang.dump import forwards as dump
    from eagle3_capture.spec import TapSpec

    model, cfg, hf = tiny["model"], tiny["cfg"], tiny["hf"]
    model.set_eagle3_layers_to_capture(list(DECLARED))
    plugin_env(EAGLE3_CAPTURE_DUMP=tmp_path / "dump", EAGLE3_CAPTURE_DUMP_MAX=1)
    r = harness.ServedRunner(model, cfg)
    r.forward(harness.PROMPT)
    r.forward([harness.DECODE_TOKEN])  # beyond EAGLE3_CAPTURE_DUMP_MAX: not dumped
    assert dump.flush(30)
    L, H = cfg.num_hidden_layers, cfg.hidden_size

    target = Target(hf, None, L, H, cfg.vocab_size, "tiny DeepseekV3 (HF)", {})
    ref = reference_tensors(target, [list(harness.PROMPT)])
    write_reference(str(tmp_path / "ref.safetensors"), ref, num_layers=L, hidden_size=H, source=target.source)

    res = fingerprint(str(tmp_path / "ref.safetensors"), str(tmp_path / "dump"))  # declared: the dump's draft ids
    assert res.declared == TapSpec.from_draft_ids(DECLARED, L, H)
    assert list(res.matched) == list(res.declared.taps), render(res)
    assert all(m.best_cos > 0.9999 for m in res.matches), render(res)
    assert not [f for f in res.findings if f.severity == "error"]
    # the last slot is the pre-norm final boundary, which HF's stack does not hold
    assert repr(res.matched[-1]) == f"LayerOutput({L - 1})"

    # read against taps shifted by one layer (what stock SGLang would have captured for these ids), the same dump
    # is flagged slot by slot
    wrong = TapSpec.from_draft_ids([0, 2, 4, 5], L, H)
    res = fingerprint(str(tmp_path / "ref.safetensors"), str(tmp_path / "dump"), declared=wrong)
    codes = [f.code for f in res.findings if f.severity == "error"]
    assert "fingerprint-unexpected-embedding" in codes and codes.count("fingerprint-shifted-tap") == 2
