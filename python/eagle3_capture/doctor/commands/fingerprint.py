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

from ..common import EXIT_FINDINGS, EXIT_OK, DoctorError, write_json


def _draft_ids(draft_config: Optional[str]) -> Optional[List[int]]:
    if draft_config is None:
        return None
    from ... import configs

    try:
        d = configs.read_draft_config(draft_config)
    except (FileNotFoundError, ValueError) as e:
        raise DoctorError(str(e)) from None
    return d.layer_ids


def run(captured: str, declared=None, training: Optional[str] = None, server: Optional[str] = None,
        target_checkpoint: Optional[str] = None, draft_config: Optional[str] = None, samples: int = 8,
        max_tokens: int = 512, timeout: float = 120.0, min_cos: float = 0.95) -> Tuple[str, dict, int]:
    """(report text, JSON, exit code)."""
    from ..target.checkpoint import CheckpointSide
    from ..target.side import layer_inputs

    if server is not None and training is None:
        raise DoctorError("--server sends the training samples' token ids to the server: it needs --training-data")
    ck = CheckpointSide(target_checkpoint)
    if training is None:
        from ..fingerprint.stream import dump_fingerprint

        expected = layer_inputs(declared) if declared is not None else None
        fp = dump_fingerprint(captured, expected, ck.tensors, ck.config, min_cos=min_cos)
        bad = fp.mismatch
        known = any(m.expected is not None for m in fp.matches)
        lines = fp.lines() + ["", f"verdict: {bad}" if bad else
                              "verdict: " + ("every served slot holds the declared tap" if known
                                             else "no declared taps to compare with (give --draft-config and "
                                                  "--target-config, or --taps)")]
        return "\n".join(lines), fp.to_json(), EXIT_FINDINGS if bad else EXIT_OK
    from ..fingerprint.training import load_samples, send_samples, training_fingerprint

    H = None
    if ck.config is not None:
        from ... import configs

        H = configs.read_target_config(ck.config).hidden_size
    smp = load_samples(training, samples, max_tokens, H)
    rids = None
    if server is not None:
        if not server.startswith(("http://", "https://")):
            raise DoctorError(f"--server {server!r}: expected the http(s):// URL of the running server")
        from ..sglang_model.http import _post_json

        rids = send_samples(server, smp, _post_json, timeout)
    fp = training_fingerprint(smp, captured, rids, _draft_ids(draft_config), timeout, min_cos)
    return "\n".join(fp.lines()), fp.to_json(), EXIT_OK if fp.same_as_served else EXIT_FINDINGS


def command(args) -> int:
    """The ``fingerprint`` subcommand: its flags checked, then with --reference the reference fingerprint
    (fingerprint.py), else :func:`run`."""
    from ..fingerprint import reference as fp
    from ... import configs
    from ...spec import TapError

    declared, src = None, ""
    if args.taps is not None and (args.draft_config is not None or args.target_config is not None):
        raise DoctorError("--taps and --draft-config/--target-config both declare the taps; give one of them")
    if (args.draft_config is None) != (args.target_config is None):
        given, missing = ("--draft-config", "--target-config") if args.target_config is None else \
            ("--target-config", "--draft-config")
        raise DoctorError(f"{given} needs {missing} (the draft ids are read against the target's layer count)")
    if args.taps is not None and not args.taps.strip():
        raise DoctorError("--taps '': expected CONV:IDS, e.g. draft_ids:-1,2,30")
    if args.reference is None and args.training_data is None and (args.samples is not None or
                                                                  args.max_tokens is not None):
        raise DoctorError("--samples / --max-tokens choose SpecForge samples: they go with --training-data")
    if args.reference is not None and (args.training_data is not None or args.server is not None or
                                       args.target_checkpoint is not None):
        raise DoctorError("--reference is a transformers model's hidden states; --training-data, --server and "
                          "--target-checkpoint are for a fingerprint without one: give one or the other")
    if args.draft_config is not None or args.taps is not None:
        if args.reference is not None:
            ref = fp.load_reference(args.reference)
            L, H = ref.num_layers, ref.hidden_size
        elif args.taps is not None:
            L, H = _dump_shape(args.captured)
        if args.taps is not None:
            from ..draft.side import parse_taps

            declared, src = parse_taps(args.taps, L, H), f"--taps {args.taps}"
        else:
            try:
                t = configs.read_target_config(args.target_config)
                d = configs.read_draft_config(args.draft_config)
                declared = configs.draft_taps(d, t)
            except (FileNotFoundError, ValueError, TapError) as e:
                raise DoctorError(str(e)) from None
            src = f"draft config {args.draft_config}"
    if args.reference is None:
        text, data, code = run(
            args.captured, declared, args.training_data, args.server, args.target_checkpoint, args.draft_config,
            args.samples or 8, args.max_tokens or 512, args.timeout, args.min_cos)
        if args.json:
            write_json(args.json, data)
        print(text)
        return code
    res = fp.fingerprint(args.reference, args.captured, declared=declared, declared_source=src,
                         min_cos=args.min_cos)
    if args.json:
        write_json(args.json, res.to_json())
    print(fp.render(res))
    errs = [f for f in res.findings if f.severity == "error"]
    if res.findings:
        print()
        for f in res.findings:
            print(f"  [{f.severity}] {f.code}: {f.message}" + (f"\n      fix: {f.fix}" if f.fix else ""))
    return EXIT_FINDINGS if errs else EXIT_OK


def _dump_shape(path: str):
    """(L, H) the records of a dump directory state."""
    from ...dump_format.reader import DumpReader

    recs = DumpReader(path).refresh()
    shapes = {(r.num_layers, r.hidden_size) for r in recs if r.num_layers and r.hidden_size}
    if len(shapes) != 1:
        raise DoctorError(f"--captured {path}: its records state no single num_layers / hidden_size ({shapes})")
    return shapes.pop()


__all__ = ["run", "command"]
