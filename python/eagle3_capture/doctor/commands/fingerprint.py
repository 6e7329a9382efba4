"""``doctor fingerprint``: which layer each captured slot holds, against one of three references.

* ``--reference REF`` (from ``dump-reference``): a transformers model's hidden states, by cosine
  (:mod:`..fingerprint.reference`);
* ``--captured DUMP`` alone: the served slots of the doctor's requests against the server's own residual stream in
  the dump (a full-stream dump names any layer); with ``--target-checkpoint`` the embedding output is checked bit for
  bit against ``embed_tokens`` rows read alone from its shard (:mod:`..fingerprint.stream`);
* ``--training-data DIR --captured DUMP [--server URL]``: SpecForge training samples against the server on the same
  token ids (``--server`` sends them as the doctor's requests first): slot by slot, and which layer each training
  slot was (:mod:`..fingerprint.training`).

Declared taps come from ``--taps``, ``--draft-config`` + ``--target-config``, or the dump. Exit 1 when a slot is not
the declared tap (or the server does not capture what training used).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .. import arg_types as at
from .. import options
from ..bounds import MAX_TIMEOUT_S
from ..common import EXIT_FINDINGS, EXIT_OK, DoctorError
from ..options import flag

DEFAULT_SAMPLES = 8
DEFAULT_MAX_TOKENS = 512  # a full-stream dump is L+1 rows of H per token

DESCRIPTION = ("Compares each captured slot with every reference hidden state by mean cosine similarity over the "
               "tokens, names the layer each slot matches and whether it is the declared one. The reference is a "
               "transformers model's hidden states (--reference, from dump-reference), or, without one, the server's "
               "own residual stream in its dump (the doctor's requests; EAGLE3_CAPTURE_DUMP_STREAM=all names any "
               "layer). With --training-data (SpecForge's .ckpt samples) it says, on the same token ids, whether the "
               "server captures what training used, slot by slot, and which layer each training slot was. A match is "
               "called ambiguous when the best layer does not beat the next by more than two captures of one tap "
               "differ. Declared taps come from --taps, --draft-config + --target-config, or the dump. Exit 1 when a "
               "slot is not the declared tap (or the server does not capture what training used).")


@dataclass(frozen=True, kw_only=True)
class Options:
    reference: Optional[str] = flag("--reference", metavar="REF.safetensors",
                                    help="from doctor dump-reference (leave out to use the server's own stream)")
    captured: str = flag("--captured", required=True, metavar="CAP",
                         help="the plugin's capture dump (EAGLE3_CAPTURE_DUMP file or directory) or a safetensors "
                              "capture")
    training_data: Optional[str] = flag("--training-data", metavar="DIR",
                                        help="SpecForge offline training data (rows_*/data_*.ckpt: input_ids, "
                                             "loss_mask, hidden_state, aux_hidden_state) to compare with what the "
                                             "server captures on the same token ids")
    server: Optional[str] = flag("--server", metavar="URL", type=at.url,  # a checked http(s) URL
                                 help="with --training-data: send the samples' token ids to this server first (as the "
                                      "doctor's requests, whose stream the plugin dumps to --captured)")
    target_checkpoint: Optional[str] = options.target_checkpoint()
    samples: Optional[int] = flag("--samples", type=at.POSITIVE, help="training samples to use (default 8)")
    max_tokens: Optional[int] = flag("--max-tokens", type=at.POSITIVE,
                                     help="tokens of each sample to use (default 512: a full-stream dump is L+1 rows "
                                          "of H per token)")
    timeout: float = flag("--timeout", type=at.finite_float(0.0, MAX_TIMEOUT_S, low_open=True), default=120.0,
                          help="seconds to wait for the server's answers and dump (default 120)")
    draft_config: Optional[str] = flag("--draft-config", metavar="PATH", help="declared taps from this draft config")
    target_config: Optional[str] = flag("--target-config", metavar="PATH",
                                        help="target config (with --draft-config)")
    taps: Optional[str] = flag("--taps", metavar="CONV:IDS",
                               help="declared taps, e.g. draft_ids:-1,2,30 or layer_inputs:0,3,31")
    min_cos: float = flag("--min-cos", type=at.finite_float(-1.0, 1.0), default=0.95,
                          help="below this a slot matches nothing (default 0.95)")
    json: Optional[str] = options.json_out("also write the table as JSON")


@dataclass
class FingerprintReport:
    """One of the three fingerprints: ``reference`` (a FingerprintResult), ``stream`` (a StreamFingerprint) or
    ``training`` (a TrainingFingerprint)."""

    kind: str
    result: object

    def to_json(self) -> dict:
        return self.result.to_json()

    @property
    def ok(self) -> bool:
        r = self.result
        if self.kind == "reference":
            return not any(f.severity == "error" for f in r.findings)
        if self.kind == "stream":
            return r.mismatch is None
        return r.ok


def _draft_ids(draft_config: Optional[str]) -> Optional[List[int]]:
    if draft_config is None:
        return None
    from ... import configs

    try:
        d = configs.read_draft_config(draft_config)
    except (FileNotFoundError, ValueError) as e:
        raise DoctorError(str(e)) from None
    return d.layer_ids


def _dump_shape(path: str):
    """(L, H) the records of a dump directory state."""
    from ...dump_format.reader import DumpReader

    recs = DumpReader(path).refresh()
    shapes = {(r.num_layers, r.hidden_size) for r in recs if r.num_layers and r.hidden_size}
    if len(shapes) != 1:
        raise DoctorError(f"--captured {path}: its records state no single num_layers / hidden_size ({shapes})")
    return shapes.pop()


def _declared(opts: Options):
    """(the declared taps or None, where they come from), after the flags that declare them are checked."""
    from ... import configs
    from ...spec import TapError

    if opts.taps is not None and (opts.draft_config is not None or opts.target_config is not None):
        raise DoctorError("--taps and --draft-config/--target-config both declare the taps; give one of them")
    if (opts.draft_config is None) != (opts.target_config is None):
        given, missing = ("--draft-config", "--target-config") if opts.target_config is None else \
            ("--target-config", "--draft-config")
        raise DoctorError(f"{given} needs {missing} (the draft ids are read against the target's layer count)")
    if opts.taps is not None and not opts.taps.strip():
        raise DoctorError("--taps '': expected CONV:IDS, e.g. draft_ids:-1,2,30")
    if opts.reference is None and opts.training_data is None and (opts.samples is not None or
                                                                  opts.max_tokens is not None):
        raise DoctorError("--samples / --max-tokens choose SpecForge samples: they go with --training-data")
    if opts.reference is not None and (opts.training_data is not None or opts.server is not None or
                                       opts.target_checkpoint is not None):
        raise DoctorError("--reference is a transformers model's hidden states; --training-data, --server and "
                          "--target-checkpoint are for a fingerprint without one: give one or the other")
    if opts.draft_config is None and opts.taps is None:
        return None, ""
    if opts.reference is not None:
        from ..fingerprint.files import load_reference

        ref = load_reference(opts.reference)
        L, H = ref.num_layers, ref.hidden_size
    elif opts.taps is not None:
        L, H = _dump_shape(opts.captured)
    if opts.taps is not None:
        from ..draft.side import parse_taps

        return parse_taps(opts.taps, L, H), f"--taps {opts.taps}"
    try:
        t = configs.read_target_config(opts.target_config)
        d = configs.read_draft_config(opts.draft_config)
        return configs.draft_taps(d, t), f"draft config {opts.draft_config}"
    except (FileNotFoundError, ValueError, TapError) as e:
        raise DoctorError(str(e)) from None


def run(opts: Options) -> FingerprintReport:
    declared, src = _declared(opts)
    if opts.reference is not None:
        from ..fingerprint.reference import fingerprint

        return FingerprintReport("reference", fingerprint(opts.reference, opts.captured, declared=declared,
                                                          declared_source=src, min_cos=opts.min_cos))
    from ..target_side.checkpoint import CheckpointSide

    if opts.server is not None and opts.training_data is None:
        raise DoctorError("--server sends the training samples' token ids to the server: it needs --training-data")
    ck = CheckpointSide(opts.target_checkpoint)
    if opts.training_data is None:
        from ..fingerprint.stream import dump_fingerprint
        from ..target_side.side import layer_inputs

        expected = layer_inputs(declared) if declared is not None else None
        return FingerprintReport("stream", dump_fingerprint(opts.captured, expected, ck.tensors, ck.config,
                                                            min_cos=opts.min_cos))
    from ..fingerprint.training import load_samples, send_samples, training_fingerprint

    H = None
    if ck.config is not None:
        from ... import configs

        H = configs.read_target_config(ck.config).hidden_size
    smp = load_samples(opts.training_data, opts.samples or DEFAULT_SAMPLES, opts.max_tokens or DEFAULT_MAX_TOKENS, H)
    rids = None
    if opts.server is not None:  # every sample checked against the target's vocabulary and the server first
        from ..sglang_model.request_guard import server_limits
        from ..target_side.checkpoint import config_vocab

        others = [(f"--target-config {opts.target_config}", config_vocab(opts.target_config))] \
            if opts.target_config is not None else []
        limits = server_limits(opts.server, min(opts.timeout, 30.0), ck.vocab_size,
                               f"--target-checkpoint {opts.target_checkpoint}", others=others)
        rids = send_samples(opts.server, smp, timeout=opts.timeout, limits=limits)
    return FingerprintReport("training", training_fingerprint(smp, opts.captured, rids, _draft_ids(opts.draft_config),
                                                              opts.timeout, opts.min_cos))


def render(rep: FingerprintReport) -> str:
    r = rep.result
    if rep.kind == "reference":
        from ..fingerprint.reference import render as render_reference

        lines = [render_reference(r)]
        if r.findings:
            lines.append("")
            for f in r.findings:
                lines.append(f"  [{f.severity}] {f.code}: {f.message}" + (f"\n      fix: {f.fix}" if f.fix else ""))
        return "\n".join(lines)
    if rep.kind == "stream":
        known = any(m.expected is not None for m in r.matches)
        return "\n".join(r.lines() + ["", f"verdict: {r.mismatch}" if r.mismatch else
                                      "verdict: " + ("every served slot holds the declared tap" if known
                                                     else "no declared taps to compare with (give --draft-config "
                                                          "and --target-config, or --taps)")])
    return "\n".join(r.lines())


def exit_code(rep: FingerprintReport) -> int:
    return EXIT_OK if rep.ok else EXIT_FINDINGS


__all__ = ["DESCRIPTION", "Options", "FingerprintReport", "run", "render", "exit_code"]
