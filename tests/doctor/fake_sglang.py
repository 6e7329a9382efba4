"""A test-only stand-in for a SGLang server with the plugin, over real HTTP: what the doctor's client talks to in
tests that run without SGLang (the engine tests run the real one).

`FakeSGLang(tf, ...)` serves, from a `dump_helpers.TeacherForced` (the demo target's greedy continuations, residual
stream and the replay of a correctly wired server):

- `GET /server_info`: the speculative flags and `max_req_input_len`, as SGLang 0.5.23 reports them (a
  `server_info` dict overrides or removes keys: a value None removes it);
- `POST /generate`: a served request (`max_new_tokens` N: the continuation and its meta_info), the doctor's extension
  (the next tokens), and the doctor's teacher-forced request (rid `eagle3-doctor-...`: `input_top_logprobs`, and its
  dump records written a moment later to `dump_dir` when one is given, as the plugin's background writer does).

It behaves as SGLang does where the doctor can hurt it: a token id outside the vocabulary kills it (SGLang's
scheduler dies of an IndexError in the embedding; every later request fails), an input of `max_req_input_len`
tokens or more is refused (HTTP 400). Each such request is kept in `harm`, so a test can assert that the doctor never
sent one. `answer_offset` adds to every output token id (a server answering with ids of another vocabulary),
`top_offset` to the teacher-forced answer's `input_top_logprobs` ids only. A `logit_bias` key outside the vocabulary
is refused as SGLang's tokenizer manager refuses it (`SamplingParams.verify`, before the scheduler: HTTP 400,
``{"error": {"message": "logit_bias must has keys in [0, V-1], got K."}}``, the text of 0.5.12 to 0.5.23);
`checks_logit_bias=False` stands for a server that does not check (it then reveals no vocabulary).
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import List, Optional

import torch

from dump_helpers import record_path, write_v2_record


class FakeSGLang:
    def __init__(self, tf, *, flags=(3, 1, 4), vocab: int = 256, max_req_input_len: int = 250,
                 dump_dir: Optional[str] = None, served=(0, 1, 4), stream_layers=(0, 1, 4), declared=None,
                 server_info: Optional[dict] = None, answer_offset: int = 0, dump_delay: float = 0.2,
                 dump_dtype: torch.dtype = torch.float32, mutate_record=None, top_offset: int = 0,
                 checks_logit_bias: bool = True):
        self.tf, self.flags, self.vocab, self.limit = tf, flags, vocab, max_req_input_len
        self.dump_dir, self.served, self.stream_layers, self.declared = dump_dir, list(served), stream_layers, declared
        self.extra_info, self.offset, self.delay, self.dtype = server_info or {}, answer_offset, dump_delay, dump_dtype
        self.mutate_record = mutate_record  # f(seq, record dict) -> None, before a dump record is written
        self.top_offset, self.checks_logit_bias = top_offset, checks_logit_bias
        self.requests: List[dict] = []
        self.harm: List[str] = []
        self.dead = False
        self._seq = 0
        self._lock = threading.Lock()
        self._threads: List[threading.Thread] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _send(self, code: int, obj) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if fake.dead:
                    return self._send(503, {"error": "the scheduler died"})
                if self.path.rstrip("/") == "/server_info":
                    return self._send(200, fake.info())
                self._send(404, {"detail": "Not Found"})

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                code, obj = fake.answer(self.path, body)
                self._send(code, obj)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # shutdown() waits for serve_forever's next poll (0.5 s by default)
        self._serve = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def __enter__(self) -> "FakeSGLang":
        self._serve.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        for t in self._threads:
            t.join()

    def info(self) -> dict:
        S, k, D = self.flags
        d = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": S, "speculative_eagle_topk": k,
             "speculative_num_draft_tokens": D, "max_req_input_len": self.limit, "max_total_num_tokens": 4096,
             "context_length": None, "version": "0.5.23"}
        d.update(self.extra_info)
        return {k: v for k, v in d.items() if v is not None}

    # ------------------------------------------------------------------------------------------------------------
    def answer(self, path: str, body: dict):
        with self._lock:
            self.requests.append(body)
        if self.dead:
            return 503, {"error": "the scheduler died"}
        if path.rstrip("/") != "/generate":
            return 404, {"detail": "Not Found"}
        bias = (body.get("sampling_params") or {}).get("logit_bias")
        if bias and self.checks_logit_bias:  # SGLang's tokenizer manager, before anything reaches the scheduler
            for key in bias:
                if not 0 <= int(key) < self.vocab:
                    return 400, {"error": {"message": f"logit_bias must has keys in [0, {self.vocab - 1}], got "
                                                      f"{key}."}}
        ids = body.get("input_ids")
        bad = [v for v in ids if not (isinstance(v, int) and 0 <= v < self.vocab)] if isinstance(ids, list) else ids
        if bad:
            self.harm.append(f"token id {bad[0]!r} outside the vocabulary of {self.vocab}")
            self.dead = True  # SGLang's scheduler: IndexError in the embedding, the process dies
            return 500, {"error": "IndexError: index out of range in self"}
        sp = body.get("sampling_params") or {}
        new = sp.get("max_new_tokens")
        if len(ids) >= self.limit or (isinstance(new, int) and len(ids) + new > self.limit + 5):
            self.harm.append(f"{len(ids)} input tokens + {new} new with max_req_input_len {self.limit}")
            return 400, {"error": f"Input length ({len(ids)} tokens) exceeds the maximum allowed length"}
        i = self._prompt_of(ids)
        if i is None:
            return 200, self._unknown(ids, body)
        t = self.tf
        full = t.sent[i].tolist()
        if str(body.get("rid", "")).startswith("eagle3-doctor-"):
            return 200, self._teacher_forced(i, ids, body)
        if len(ids) == len(t.prompts[i]):  # served
            r = t.responses()[i]
            out = [v + self.offset for v in r["output_ids"][:new]]
            return 200, {"output_ids": out, "meta_info": r["meta_info"]}
        return 200, {"output_ids": [v + self.offset for v in full[len(ids):len(ids) + new]], "meta_info": {}}

    def _prompt_of(self, ids) -> Optional[int]:
        t = self.tf
        for i, p in enumerate(t.prompts):
            full = t.sent[i].tolist()
            if ids[:len(p)] == p and ids == full[:len(ids)]:
                return i
        return None

    def _unknown(self, ids, body) -> dict:
        """Ids the stand-in has no continuation for (a training sample): the demo target run on them."""
        from eagle3_capture.doctor.target_side.model import residual_stream

        m = self.tf.side.target.model
        stack, _, greedy = residual_stream(m, torch.tensor([ids]))
        if str(body.get("rid", "")).startswith("eagle3-doctor-"):
            self._dump_later(body["rid"], torch.tensor(ids), stack[0])
        return {"output_ids": [int(greedy[0, -1])], "meta_info": {
            "input_top_logprobs": [None] + [[[-1.0, int(g), None]] for g in greedy[0, :-1].tolist()]}}

    def _teacher_forced(self, i: int, ids, body) -> dict:
        t = self.tf
        greedy = t.greedy[i].tolist()
        T = len(ids)
        self._dump_later(body["rid"], t.sent[i][:T], t.stack[i][:T])
        off = self.offset + self.top_offset
        return {"output_ids": [greedy[T - 1] + self.offset], "meta_info": {
            "input_top_logprobs": [None] + [[[-1.0, g + off, None]] for g in greedy[:T - 1]]}}

    def _dump_later(self, rid: str, ids: torch.Tensor, stack: torch.Tensor) -> None:
        if self.dump_dir is None:
            return

        def write():
            time.sleep(self.delay)
            with self._lock:
                seq = self._seq
                self._seq += 1
            T = ids.numel()
            st = stack.to(self.dtype)
            stream = None if self.stream_layers is None else st[:, list(self.stream_layers)].permute(1, 0, 2)
            rec = dict(seq=seq, mode="EXTEND", input_ids=ids, positions=torch.arange(T),
                       requests=[{"rid": rid, "row_start": 0, "row_end": T, "prefix_len": 0}],
                       aux=st[:, self.served].reshape(T, -1).contiguous(), layers_to_capture=self.served,
                       stream=None if stream is None else stream.contiguous(),
                       stream_layer_inputs=self.stream_layers, num_layers=self.tf.L, hidden_size=self.tf.H,
                       declared=self.declared)
            if self.mutate_record is not None:
                self.mutate_record(seq, rec)
            write_v2_record(record_path(self.dump_dir, seq), **rec)

        th = threading.Thread(target=write, daemon=True)
        self._threads.append(th)
        th.start()


__all__ = ["FakeSGLang"]
