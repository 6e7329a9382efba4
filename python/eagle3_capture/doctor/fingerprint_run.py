"""``doctor fingerprint`` without ``--reference``: the server's own dump is the reference.

* ``--captured DUMP``: the served slots of the doctor's requests against their residual stream (a full-stream dump
  names any layer); with ``--target-checkpoint`` the embedding output is checked bit for bit against
  ``embed_tokens`` rows read alone from its shard.
* ``--training-data DIR --captured DUMP [--server URL]``: SpecForge training samples against the server on the same
  token ids (``--server`` sends them as the doctor's requests first): slot by slot, and which layer each training
  slot was.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from .common import EXIT_FINDINGS, EXIT_OK, DoctorError


def _draft_ids(draft_config: Optional[str]) -> Optional[List[int]]:
    if draft_config is None:
        return None
    from .. import configs

    try:
        d = configs.read_draft_config(draft_config)
    except (FileNotFoundError, ValueError) as e:
        raise DoctorError(str(e)) from None
    return d.layer_ids


def run(captured: str, declared=None, training: Optional[str] = None, server: Optional[str] = None,
        target_checkpoint: Optional[str] = None, draft_config: Optional[str] = None, samples: int = 8,
        max_tokens: int = 512, timeout: float = 120.0, min_cos: float = 0.95) -> Tuple[str, dict, int]:
    """(report text, JSON, exit code)."""
    from .checkpoint_tensors import CheckpointSide
    from .target_side import layer_inputs

    if server is not None and training is None:
        raise DoctorError("--server sends the training samples' token ids to the server: it needs --training-data")
    ck = CheckpointSide(target_checkpoint)
    if training is None:
        from .fingerprint_stream import dump_fingerprint

        expected = layer_inputs(declared) if declared is not None else None
        fp = dump_fingerprint(captured, expected, ck.tensors, ck.config, min_cos=min_cos)
        bad = fp.mismatch
        known = any(m.expected is not None for m in fp.matches)
        lines = fp.lines() + ["", f"verdict: {bad}" if bad else
                              "verdict: " + ("every served slot holds the declared tap" if known
                                             else "no declared taps to compare with (give --draft-config and "
                                                  "--target-config, or --taps)")]
        return "\n".join(lines), fp.to_json(), EXIT_FINDINGS if bad else EXIT_OK
    from .fingerprint_training import load_samples, send_samples, training_fingerprint

    H = None
    if ck.config is not None:
        from .. import configs

        H = configs.read_target_config(ck.config).hidden_size
    smp = load_samples(training, samples, max_tokens, H)
    rids = None
    if server is not None:
        if not server.startswith(("http://", "https://")):
            raise DoctorError(f"--server {server!r}: expected the http(s):// URL of the running server")
        from .online import _post_json

        rids = send_samples(server, smp, _post_json, timeout)
    fp = training_fingerprint(smp, captured, rids, _draft_ids(draft_config), timeout, min_cos)
    return "\n".join(fp.lines()), fp.to_json(), EXIT_OK if fp.same_as_served else EXIT_FINDINGS


__all__ = ["run"]
