"""The target side from a live server (``doctor online --server URL --dump DIR`` without ``--target``): the server
itself runs the target, so the doctor needs no copy of it.

After the prompts are served (``sglang_model.http.generate``), per prompt:

1. an extension: ``prompt + served continuation`` with ``max_new_tokens`` = num-steps + 1, greedy -- the tokens past
   the served ones that SGLang's last verifies look at (it counts what they accept, then cuts the output);
2. the teacher-forced pass of the dump format: ``prompt + continuation + extension`` as one prefill, with
   ``rid`` ``eagle3-doctor-<run>-<i>`` (the plugin dumps the residual stream of forwards holding such a request),
   ``return_logprob``, ``logprob_start_len`` 0 (which also keeps SGLang from reusing its prefix cache, so every row
   is computed) and ``top_logprobs_num`` 2: ``input_top_logprobs`` gives the target's two best tokens at every
   position and their logprob gap, computed by another pass than the verifies';
3. the dump directory is read until every teacher-forced request's rows are there (the plugin writes in the
   background).

The replay follows the path the server served: each draft step's label is the served token (the verify pass's own
argmax; past the output, the extension's), not the teacher-forced argmax, which may differ at a bf16 near-tie
(two passes of different shapes round differently; replay/near_ties.py lists those). The teacher-forced argmax is
what the outputs are checked against (lossless), a near-tie aside.

The dump directory is the one the server was started with (``EAGLE3_CAPTURE_DUMP``): the doctor reads the files,
so it must see the server's filesystem.
"""
from __future__ import annotations

import os
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ...dump_format.contract import DOCTOR_RID_PREFIX, DumpError
from ...dump_format.reader import DumpReader, RequestParts, by_rid, doctor_requests, one_writer, v1_sequences
from ..common import DoctorError
from ..progress import bar as progress_bar
from ..sglang_model.http import post_json
from ..sglang_model.request_guard import check_ids
from .dump_side import StreamedPrompt, StreamTarget, info_from_dump

# seconds without a new record or a file growing in the directory, once the server has answered every teacher-forced
# request, before the wait gives up (the plugin's writer is a moment behind the answers, in the background)
STALL_S = 30.0


def greedy_from_logprobs(obj, what: str, T: int, vocab: Optional[int] = None) -> torch.Tensor:
    """[T]: the top-1 token after each of the T input positions, from a /generate answer with input_top_logprobs."""
    return top2_from_logprobs(obj, what, T, vocab)[0]


def top2_from_logprobs(obj, what: str, T: int, vocab: Optional[int] = None):
    """([T] top-1 token, [T] runner-up (-1: not given), [T] float64 logprob gap top-1 - runner-up (nan: not given))
    after each of the T input positions, from a /generate answer with input_top_logprobs (top_logprobs_num 1 or
    2); after the last position, the generated token (no runner-up). Every id is checked against ``vocab`` (an id
    outside it: another model answers, and no verdict may rest on it)."""
    if isinstance(obj, list) and len(obj) == 1:
        obj = obj[0]
    meta = obj.get("meta_info") if isinstance(obj, dict) else None
    if not isinstance(meta, dict):
        raise DoctorError(f"{what}: no meta_info in the answer: {str(obj)[:160]}")
    top, out = meta.get("input_top_logprobs"), obj.get("output_ids")
    if not isinstance(top, list) or len(top) != T:
        raise DoctorError(f"{what}: meta_info input_top_logprobs has "
                          f"{len(top) if isinstance(top, list) else type(top).__name__} entries, expected one per "
                          f"input token ({T}): does this server return input logprobs (return_logprob, "
                          "logprob_start_len 0)?")
    if not isinstance(out, list) or not out or not isinstance(out[0], int):
        raise DoctorError(f"{what}: no output_ids in the answer")
    greedy = torch.full((T,), -1, dtype=torch.int64)
    second = torch.full((T,), -1, dtype=torch.int64)
    gap = torch.full((T,), float("nan"), dtype=torch.float64)
    for t in range(1, T):
        e = top[t]
        try:
            tok = e[0][1]
        except (TypeError, IndexError, KeyError):
            tok = None
        if not isinstance(tok, int) or isinstance(tok, bool):
            raise DoctorError(f"{what}: input_top_logprobs[{t}] is {str(e)[:80]!r}; expected [[logprob, token id, "
                              "text], ...] (top_logprobs_num 1 or 2)")
        greedy[t - 1] = tok
        if len(e) > 1:
            try:
                (lp1, lp2), tok2 = (float(e[0][0]), float(e[1][0])), e[1][1]
            except (TypeError, IndexError, KeyError, ValueError):
                raise DoctorError(f"{what}: input_top_logprobs[{t}] is {str(e)[:80]!r}; expected [[logprob, token "
                                  "id, text], [logprob, token id, text]]") from None
            if isinstance(tok2, int) and not isinstance(tok2, bool):
                second[t - 1], gap[t - 1] = tok2, lp1 - lp2
    greedy[T - 1] = out[0]
    check_ids(greedy.tolist() + [v for v in second.tolist() if v != -1], vocab,
              f"{what}: input_top_logprobs / output_ids")
    return greedy, second, gap


class ServerTarget(StreamTarget):
    """A live server and its dump directory, after :meth:`teacher_force`."""

    greedy_is_own = True

    @classmethod
    def teacher_force(cls, url: str, dump_dir: str, prompts: Sequence[List[int]], outputs: Sequence[List[int]],
                      steps: int, post: Callable[[str, dict, float], object] = post_json, timeout: float = 600.0,
                      concurrency: int = 8, progress: bool = False, checkpoint_config: Optional[dict] = None,
                      vocab_size: Optional[int] = None, tokenizer=None) -> "ServerTarget":
        """The teacher-forced pass of ``prompts`` + the server's ``outputs`` through ``post`` (the HTTP client; a
        test hands in a stand-in for the server), then its rows read from ``dump_dir``."""
        base = url.rstrip("/") + "/generate"
        run = uuid.uuid4().hex[:12]
        n = len(prompts)

        def send(body: dict, what: str):
            try:
                return post(base, body, timeout)
            except DoctorError as e:
                raise DoctorError(f"{e} -- the {what} of the teacher-forced pass sends each prompt + its "
                                  f"{len(outputs[0])} new tokens + {steps + 1} (num-steps + 1); near the context "
                                  "length give fewer --new-tokens") from None

        def extend(i: int) -> List[int]:
            ids = list(prompts[i]) + list(outputs[i])
            obj = send({"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": steps + 1,
                                                               "ignore_eos": True}}, "extension")
            if isinstance(obj, list) and len(obj) == 1:
                obj = obj[0]
            ext = obj.get("output_ids") if isinstance(obj, dict) else None
            if not isinstance(ext, list) or len(ext) != steps + 1:
                raise DoctorError(f"--server {base}, prompt {i}: the extension by {steps + 1} tokens returned "
                                  f"{str(ext)[:80]!r} (a context limit?)")
            bad = next((v for v in ext if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < vocab_size),
                       None) if vocab_size else None
            if bad is not None:  # never sent back in the teacher-forced request: it would kill the scheduler
                raise DoctorError(f"--server {base}, prompt {i}: the extension returned token id {bad!r}, outside "
                                  f"the target's vocabulary ({vocab_size}): the server runs another model")
            return ids + ext

        def force(i: int, ids: List[int]):
            body = {"input_ids": ids, "rid": f"{DOCTOR_RID_PREFIX}{run}-{i}",
                    "sampling_params": {"temperature": 0, "max_new_tokens": 1, "ignore_eos": True},
                    "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2}
            return top2_from_logprobs(send(body, "prefill"), f"--server {base}, teacher-forced prompt {i}", len(ids),
                                      vocab_size)

        bar = progress_bar(2 * n, "teacher-forced pass", "request", progress)
        with ThreadPoolExecutor(max_workers=max(1, min(concurrency, n))) as pool:
            seqs = []
            for s in pool.map(extend, range(n)):
                seqs.append(s)
                bar.update(1)
            greedy = []
            for g in pool.map(force, range(n), seqs):
                greedy.append(g)
                bar.update(1)
        bar.close()
        rids = [f"{DOCTOR_RID_PREFIX}{run}-{i}" for i in range(n)]
        found = wait_for_requests(dump_dir, rids, [torch.tensor(s) for s in seqs], timeout, progress)
        where = f"--dump {dump_dir}"
        info = info_from_dump(found, where, checkpoint_config, vocab_size)
        streamed = []
        for i, (s, (g, second, gap), p) in enumerate(zip(seqs, greedy, found)):
            x = torch.tensor(s, dtype=torch.int64)
            served = torch.full_like(x, -1)
            P = len(prompts[i])
            served[P - 1:-1] = x[P:]       # the served path: the token after each position is the one served
            served[-1] = g[-1]
            streamed.append(StreamedPrompt(x, served, p, g, second, gap))
        target = cls(f"server {url} (its residual stream, dump {dump_dir})", info, streamed, tokenizer)
        target.run = run
        disagree = [i for i, (s, (g, _, _)) in enumerate(zip(seqs, greedy)) if s[len(prompts[i]) + len(outputs[i]):]
                    != g[len(prompts[i]) + len(outputs[i]) - 1:-1].tolist()]
        if disagree:
            target.notes.append(f"{len(disagree)} prompt(s) (first {disagree[0]}): the extension's greedy tokens "
                                "differ from the teacher-forced pass's (near-ties in the logits: two passes of "
                                "different shapes)")
        return target

    def batch(self, prompts, members, continuation, wanted):
        """The stream target's batch, its ``expected`` from the teacher-forced argmax (what the served outputs are
        checked against), its labels the served path."""
        b = super().batch(prompts, members, continuation, wanted)
        T = b.seq.shape[1]
        forced = torch.stack([self.streamed[i].forced[:T] for i in members])
        b.expected = torch.cat([b.seq[:, :1], forced[:, :-1]], 1)
        return b


def _has(parts: Optional[RequestParts], n: int) -> bool:
    """The request's first n positions are all in the dump (a chunk may still be on its way)."""
    if parts is None:
        return False
    try:
        return parts.input_ids.numel() >= n
    except DumpError:  # a gap between chunks: the writer is behind, or a chunk is lost (said at the deadline)
        return False


def _bytes_in(d: str) -> int:
    """The bytes of every file in the directory (a record being written grows before it is listed)."""
    total = 0
    try:
        with os.scandir(d) as it:
            for e in it:
                try:
                    total += e.stat().st_size if e.is_file() else 0
                except OSError:  # renamed or removed meanwhile
                    pass
    except OSError:
        return -1
    return total


def _gap(parts: Optional[RequestParts]) -> Optional[str]:
    """What is wrong with a request that is in the dump with a gap in its positions (None: no such gap)."""
    if parts is None:
        return None
    try:
        parts.input_ids
    except DumpError as e:
        return str(e)
    return None


def wait_for_requests(dump_dir: str, rids: List[str], seqs: List[torch.Tensor], timeout: float,
                      progress: bool = False) -> List[RequestParts]:
    """Each teacher-forced request's rows in the dump, read until all are there; given up at ``timeout``, or
    :data:`STALL_S` after the last new record (the server has answered every request by then: its writer is a
    moment behind at most). ``progress``: say on stderr what it waits for."""
    reader = DumpReader(dump_dir)
    deadline = time.time() + timeout
    seen, changed = None, time.time()
    if progress:
        print(f"waiting up to {timeout:g} s for the plugin's records of {len(rids)} teacher-forced request(s) (rid "
              f"{rids[0].rsplit('-', 1)[0]}-*) in {dump_dir}; giving up after {STALL_S:g} s without a new record",
              file=sys.stderr, flush=True)
    while True:
        records = reader.refresh()
        written: Dict[str, List[RequestParts]] = by_rid(doctor_requests(records))
        found = [one_writer(r, written[r], f"--dump {dump_dir}") if r in written else None for r in rids]
        complete = [_has(p, s.numel()) for p, s in zip(found, seqs)]
        if all(complete):
            break
        if not any(r.version == 2 for r in records):
            v1 = v1_sequences(records)
            hits = [next((p for p in v1 if torch.equal(p.input_ids, s)), None) for s in seqs]
            if all(h is not None for h in hits):
                return hits
        now = time.time()
        activity = (len(records), _bytes_in(dump_dir))  # a large record still being written counts as progress
        if activity != seen:
            seen, changed = activity, now
        stalled = now - changed > STALL_S  # the server answered every request; nothing new since
        if now > deadline or stalled:
            missing = [(r, p) for r, p, ok in zip(rids, found, complete) if not ok]
            gap = next((g for g in (_gap(p) for _, p in missing) if g), None)
            if gap:
                raise DoctorError(f"--dump {dump_dir}: {gap}")
            why = (f"nothing new was written there for {STALL_S:g} s after the server answered every request" if
                   stalled and now <= deadline else f"after {timeout:g} s")
            raise DoctorError(
                f"--dump {dump_dir}: {why}, {len(missing)} of {len(rids)} teacher-forced requests (rid "
                f"{missing[0][0]}, ...) are not in it ({len(records)} records there): is it the directory the server "
                "writes (its EAGLE3_CAPTURE_DUMP), seen from here, and is the plugin's dump on?")
        time.sleep(0.5)
    for p, s, r in zip(found, seqs, rids):
        if not torch.equal(p.input_ids[:s.numel()], s):
            raise DoctorError(f"--dump {dump_dir}: request {r}'s dumped token ids differ from those sent")
    return found


__all__ = ["ServerTarget", "wait_for_requests", "greedy_from_logprobs", "top2_from_logprobs"]
