"""``doctor online``, the run: the server's responses, the target side, the draft, the replay, the comparison.

The target side is a transformers model with ``--target`` (unchanged), else the server itself: with a URL the
doctor sends its teacher-forced pass and reads the plugin's dump (``--dump DIR``, :mod:`.target_server`); with a
file of recorded responses it reads a recorded dump of such a pass (:class:`~.target_stream.DumpTarget`). Without
``--target`` the served slots are also fingerprinted against the server's stream (:mod:`.fingerprint_stream`).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Tuple

import torch

from ..bounds import MAX_TIMEOUT_S, check_positions, check_speculative
from ..common import DoctorError, read_prompts, write_json
from ..sglang_model.http import OnlineReport, Response, StepRow, _flags_from, _post_json, fetch, read_recorded, render, \
    server_flags, verdict_of
from ..sglang_model.responses import has_histograms
from ..sglang_model.server_url import is_url as url_like, server_source
from ..sglang_model.serving import step_acceptance, total


def _validate(tolerance, timeout, concurrency, batch_size, new_tokens) -> None:
    if not 0 <= tolerance < 1:
        raise DoctorError(f"--tolerance {tolerance}: expected a share in [0, 1)")
    if timeout <= 0:
        raise DoctorError(f"--timeout {timeout}: expected a positive number of seconds")
    if concurrency < 1:
        raise DoctorError(f"--concurrency {concurrency}: expected at least 1")
    if batch_size < 1:
        raise DoctorError(f"--batch-size {batch_size}: expected at least 1")
    if new_tokens is not None and new_tokens < 2:
        raise DoctorError(f"--new-tokens {new_tokens}: need at least 2")
    if timeout > MAX_TIMEOUT_S:
        raise DoctorError(f"--timeout {timeout:g}: at most {MAX_TIMEOUT_S:g} s (a day) per response")


def _recorded(server: str, prompts: List[List[int]], prompts_path: str, new_tokens: Optional[int]
              ) -> Tuple[List[Response], int]:
    recorded = read_recorded(server)
    by_ids: Dict[Tuple[int, ...], Response] = {tuple(r.input_ids): r for r in recorded}
    missing = [i for i, p in enumerate(prompts) if tuple(p) not in by_ids]
    if missing:
        raise DoctorError(f"--server {server}: no recorded response for prompt {missing[0]} of {prompts_path}"
                          f" ({len(missing)} of {len(prompts)} missing)")
    responses = [by_ids[tuple(p)] for p in prompts]
    lengths = sorted({r.served.completion_tokens for r in responses})
    if new_tokens is None:
        if len(lengths) != 1:
            raise DoctorError(f"--server {server}: the responses have {lengths} completion tokens; give "
                              "--new-tokens (the max_new_tokens they were served with)")
        new_tokens = lengths[0]
        if new_tokens < 2:
            raise DoctorError(f"--server {server}: the responses have {new_tokens} completion token each; the "
                              "replay needs responses to max_new_tokens >= 2")
    return responses, new_tokens  # a given --new-tokens was checked by _validate


def _draft_vocabs(draft_path: str) -> Tuple[Optional[int], Optional[int]]:
    """The draft config's (``vocab_size``: the target's vocabulary, ``draft_vocab_size``: the draft's own head,
    ``vocab_size`` where it has none), each None when absent."""
    from ..common import read_json

    cfg = read_json(os.path.join(draft_path, "config.json"), "draft config")

    def get(key):
        v = cfg.get(key) if isinstance(cfg, dict) else None
        return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None

    return get("vocab_size"), get("draft_vocab_size") or get("vocab_size")


def _max_positions(config: Optional[dict]) -> Optional[int]:
    """max_position_embeddings of the target checkpoint's config (its text config's), None when not given."""
    if not isinstance(config, dict):
        return None
    cfg = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    v = cfg.get("max_position_embeddings")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def run_online(server: str, prompts_path: str, target_path: Optional[str], draft_path: str,
               server_args: Optional[str] = None, new_tokens: Optional[int] = None, taps: Optional[str] = None,
               batch_size: int = 8, device: str = "cpu", timeout: float = 600.0, concurrency: int = 8,
               tolerance: float = 0.02, out_json: Optional[str] = None, progress: bool = True, seed: int = 0,
               dump: Optional[str] = None, target_checkpoint: Optional[str] = None,
               dtype: Optional[str] = None) -> OnlineReport:
    from ..target.checkpoint import CheckpointSide
    from ..draft.side import draft_dtype, load_draft_side
    from .accept import metrics
    from ..replay.evaluate import evaluate, served_walks
    from ..sglang_model.flag_rules import SpecResolution, not_eagle3, parse_server_args

    _validate(tolerance, timeout, concurrency, batch_size, new_tokens)
    new_tokens_given = new_tokens is not None
    is_url = url_like(server)
    server = server_source(server)
    refused = not_eagle3(parse_server_args(server_args)) if server_args else None
    if refused:  # before any model loads or any request goes out
        raise DoctorError(f"--server-args: {refused}")
    if target_path is not None and (dump is not None or target_checkpoint is not None):
        raise DoctorError("--target runs the target here; --dump / --target-checkpoint are for a run without it "
                          "(the server as the target): give one or the other")
    if target_path is None and dump is None:
        raise DoctorError("without --target the server is the target: give --dump DIR, the directory the server "
                          "was started with in EAGLE3_CAPTURE_DUMP (readable from here)")
    torch_dtype = draft_dtype(dtype, device, target_path is not None)
    notes: List[str] = []
    if target_path is not None:
        from ..target.model_side import TransformersTarget

        side = TransformersTarget.load(target_path, device=device, seed=seed, quiet=not progress)
        embed = side.target.model.get_input_embeddings().weight.detach()
        head = side.target.model.get_output_embeddings().weight.detach()
        ds = load_draft_side(draft_path, side.info, taps, device, torch_dtype, embed, head)
        tokenizer, vocab, arch = side.tokenizer, side.info.vocab_size, side.info.architecture
        positions = side.target.model  # its config's max_position_embeddings
        draft_vocab = ds.draft.arch.draft_vocab_size
    else:
        ck = CheckpointSide(target_checkpoint)
        tokenizer = ck.tokenizer
        target_vocab, draft_vocab = _draft_vocabs(draft_path)
        vocab = ck.vocab_size or target_vocab
        arch = None
        if ck.config is not None:
            from ... import configs

            tcfg = configs.read_target_config(ck.config)
            arch = tcfg.architectures[0] if tcfg.architectures else None
        positions = _max_positions(ck.config)
    prompts = read_prompts(prompts_path, tokenizer, vocab_size=vocab)
    if is_url:
        if new_tokens is None:
            raise DoctorError("--new-tokens is needed with a server URL (max_new_tokens of each request)")
        from_server = server_flags(server, min(timeout, 30.0))
        steps = 0
        if server_args or from_server:  # the flags, checked before the server is asked for anything
            early = _flags_from(server_args, arch, from_server, [])
            if draft_vocab is not None:
                check_speculative(*early, draft_vocab, "server flags")
            steps = early[0]
        check_positions(positions, prompts, new_tokens, steps, "--new-tokens")
        responses = fetch(server, prompts, new_tokens, timeout, concurrency, progress)
    else:
        from_server = None
        responses, new_tokens = _recorded(server, prompts, prompts_path, new_tokens)
    short = [i for i, r in enumerate(responses) if r.served.completion_tokens != new_tokens]
    if short:
        r = responses[short[0]]
        raise DoctorError(f"prompt {short[0]}: the server returned {r.served.completion_tokens} tokens, not "
                          f"max_new_tokens {new_tokens} (context limit or an early stop); the replay needs full-length "
                          "greedy responses with ignore_eos")
    flags = _flags_from(server_args, arch, from_server, responses)
    S, k, D = flags
    if draft_vocab is not None:
        check_speculative(S, k, D, draft_vocab, "server flags")
    check_positions(positions, prompts, new_tokens, S,
                    "--new-tokens" if is_url or new_tokens_given else f"completion_tokens of --server {server}")
    if target_path is None:
        from ..target.dump_side import DumpTarget

        if is_url:
            from ..target.server_side import ServerTarget

            side = ServerTarget.teacher_force(server, dump, prompts, [r.output_ids for r in responses], S,
                                              _post_json, timeout, concurrency, progress, ck.config, vocab,
                                              tokenizer)
        else:
            side = DumpTarget(dump, ck.config, vocab, tokenizer, flag="--dump")
        if arch is None and server_args and not from_server and side.info.architecture:
            again = _flags_from(server_args, side.info.architecture, None, responses)
            if tuple(again) != tuple(flags):
                raise DoctorError(f"--server-args resolve to {tuple(flags)} without the target's class and to "
                                  f"{tuple(again)} for {side.info.architecture}: give every --speculative-* number")
        embed, head = ck.weights(side.info, device)
        ds = load_draft_side(draft_path, side.info, taps, device, torch_dtype, embed, head)
    res = SpecResolution(S, k, D, requested=flags)
    notes += ds.notes
    runs = evaluate(side, ds.draft, prompts, ds.taps, S, new_tokens, res, batch_size, progress, desc="offline")
    notes += side.notes
    predicted = served_walks(runs, new_tokens)
    lossless, first = [], None
    for i, (run, resp) in enumerate(zip(runs, responses)):
        own = run.expected if run.expected is not None else run.seq
        want = own[len(run.prompt): len(run.prompt) + new_tokens].tolist()
        same = want == resp.output_ids
        lossless.append(same)
        if not same and first is None:
            pos = next((j for j, (a, b) in enumerate(zip(want, resp.output_ids)) if a != b),
                       min(len(want), len(resp.output_ids)))
            first = (i, pos)
    on_tot, pr_tot = total([r.served for r in responses]), total(predicted)
    m = metrics(torch.cat([r.correct for r in runs], 0))
    on_steps, pr_steps = step_acceptance(on_tot.histogram, S), step_acceptance(pr_tot.histogram, S)
    if not has_histograms(responses):
        on_steps = [float("nan")] * S
        notes.append("the responses carry no spec_correct_drafts_histogram (newer SGLang names only): no per-step "
                     "figures online; the accept lengths are compared")
    rows = [StepRow(j + 1, on_steps[j], pr_steps[j], m.conditional[j] if k == 1 else float("nan"))
            for j in range(S)]
    ok, verdict = verdict_of(lossless, first, rows, on_tot, pr_tot, tolerance)
    fp_json, fp_lines = None, []
    if target_path is None:
        from ..fingerprint.stream import served_fingerprint

        fp = served_fingerprint(side, ds, ck.tensors, progress)
        fp_json, fp_lines = fp.to_json(), fp.lines()
        if fp.mismatch:
            verdict = (verdict if not ok else "served accept length as predicted, but") + "; " + fp.mismatch
            ok = False
    if k > 1:
        notes.append("eagle-topk > 1: the per-step shares are of the tree's accepted depth; 'all positions' is "
                     "given for chains only")
    rep = OnlineReport(server, side.source, draft_path, [repr(t) for t in ds.taps.taps], flags, new_tokens,
                       [r.served for r in responses], predicted, lossless, first, rows, tolerance, verdict, ok,
                       m.tau(S), notes, fp_json, fp_lines)
    if out_json:
        write_json(out_json, rep.to_json())
    return rep


__all__ = ["run_online", "render"]
