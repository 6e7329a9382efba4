"""Test-only writers of what the doctor reads from a server, built from the demo's transformers target:

- `write_v2_record(...)`: one record of the plugin's dump, version 2, field for field as the dump format text
  (the plugin writes the real ones; these stand in for them in tests that run without SGLang);
- `TeacherForced`: the doctor's teacher-forced requests of some prompts, as a server with the plugin would serve
  and dump them: the served responses (meta_info from the replay of a correctly wired server), and the dump's
  records (served slots at `served` layer inputs, stream at `stream_layers`), optionally split in prefill chunks;
- `write_training(...)`: SpecForge offline training samples (.ckpt) with the taps at given layer inputs.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Optional, Sequence

import torch

FORMAT = "eagle3-capture-dump/2"


def write_v2_record(path: str, *, seq: int, mode: str, input_ids, positions, requests, aux, layers_to_capture,
                    stream, stream_layer_inputs, num_layers: int, hidden_size: int,
                    model_class: str = "DeepseekV3ForCausalLM", draft_ids=None, declared=None,
                    declared_convention=None, **override) -> str:
    rec = {
        "format": FORMAT, "seq": seq, "forward_mode": mode, "graph": False,
        "input_ids": torch.as_tensor(input_ids, dtype=torch.int64), "positions": torch.as_tensor(positions,
                                                                                                 dtype=torch.int64),
        "requests": requests, "aux": aux, "layers_to_capture": list(layers_to_capture),
        "draft_ids": draft_ids, "declared": declared, "declared_convention": declared_convention,
        "describe": None, "stream": stream, "stream_layer_inputs": None if stream is None else list(stream_layer_inputs),
        "num_layers": num_layers, "hidden_size": hidden_size, "model_class": model_class,
        "dtype": str(aux.dtype) if aux is not None else None, "tp_rank": 0, "tp_size": 1, "attn_tp_rank": 0,
        "attn_tp_size": 1, "dp_rank": None, "writer": "test: attn-TP rank 0 of the only DP group",
    }
    if override.get("format") == "eagle3-capture-dump/3":  # the writing process, as the plugin's version 3 adds it
        rec["pid"] = int(os.path.basename(path).split("_pid")[1].split("_")[0]) if "_pid" in path else 1
    rec.update(override)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(rec, path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def record_path(d: str, seq: int, pid: int = 4242) -> str:
    return os.path.join(d, f"eagle3_capture_pid{pid}_tp0_{seq:06d}.pt")


class TeacherForced:
    """The demo target's side of `doctor online` for some prompts: HF greedy continuation, residual stream, and the
    replay of a correctly wired server (`draft_dir`'s declared taps) for the served meta_info."""

    def __init__(self, prompts: Sequence[List[int]], draft_dir: str, new_tokens: int, flags=(3, 1, 4), seed: int = 0):
        from eagle3_capture.doctor.draft.side import load_draft_side
        from eagle3_capture.doctor.replay.evaluate import evaluate, served_walks
        from eagle3_capture.doctor.sglang_model.flag_rules import SpecResolution
        from eagle3_capture.doctor.target_side.model import greedy_continue, residual_stream
        from eagle3_capture.doctor.target_side.model_side import TransformersTarget

        self.prompts = [list(p) for p in prompts]
        self.N, self.flags = new_tokens, flags
        S = flags[0]
        self.side = TransformersTarget.load("demo", seed=seed)
        m = self.side.target.model
        self.L, self.H = self.side.info.num_layers, self.side.info.hidden_size
        ds = load_draft_side(draft_dir, self.side.info, None, "cpu", None, m.get_input_embeddings().weight,
                             m.get_output_embeddings().weight)
        self.draft_side = ds
        runs = evaluate(self.side, ds.draft, self.prompts, ds.taps, S, new_tokens, SpecResolution(*flags), 8, False)
        self.served = served_walks(runs, new_tokens)
        # what the doctor sends in its teacher-forced pass: prompt + N served + S + 1 extension tokens
        self.sent, self.stack, self.greedy = [], [], []
        for p in self.prompts:
            ids = greedy_continue(m, torch.tensor([p]), new_tokens + S + 1)
            stack, _, greedy = residual_stream(m, ids)
            self.sent.append(ids[0])
            self.stack.append(stack[0])          # [T, L+1, H], layer inputs 0..L
            self.greedy.append(greedy[0])

    def responses(self) -> List[dict]:
        out = []
        for p, ids, s in zip(self.prompts, self.sent, self.served):
            out.append({"input_ids": p, "output_ids": ids[len(p): len(p) + self.N].tolist(),
                        "meta_info": {"completion_tokens": s.completion_tokens, "spec_verify_ct": s.verify_ct,
                                      "spec_correct_drafts_histogram": s.histogram,
                                      "spec_num_proposed_drafts": (self.flags[2] - 1) * s.verify_ct}})
        return out

    def write_responses(self, path: str) -> str:
        with open(path, "w") as f:
            for r in self.responses():
                f.write(json.dumps(r) + "\n")
        return path

    def write_dump(self, d: str, served: Sequence[int], stream_layers: Optional[Sequence[int]],
                   run: str = "testrun", per_record: int = 2, chunk: Optional[int] = None,
                   dtype: torch.dtype = torch.float32, start_seq: int = 0, declared=None, pid: int = 4242,
                   holds: Optional[Sequence[int]] = None, **override) -> List[str]:
        """Records of the teacher-forced requests: `per_record` requests a forward; `chunk`: split each request's
        rows over forwards of at most that many rows (chunked prefill); `pid`: the writing process in the names;
        `holds`: the layer inputs the slots really hold (default `served`, their label)."""
        pieces = []  # (rid, ids, positions, stack rows)
        for i, (ids, stack) in enumerate(zip(self.sent, self.stack)):
            T = ids.numel()
            step = chunk or T
            for s in range(0, T, step):
                pieces.append((f"eagle3-doctor-{run}-{i}", ids[s:s + step], torch.arange(s, min(T, s + step)),
                               stack[s:s + step]))
        paths, seq = [], start_seq
        for b in range(0, len(pieces), per_record):
            group = pieces[b:b + per_record]
            reqs, row = [], 0
            for rid, ids, pos, _ in group:
                reqs.append({"rid": rid, "row_start": row, "row_end": row + ids.numel(), "prefix_len": int(pos[0])})
                row += ids.numel()
            stack = torch.cat([g[3] for g in group]).to(dtype)
            aux = stack[:, list(holds if holds is not None else served)].reshape(stack.shape[0], -1).contiguous()
            stream = None if stream_layers is None else stack[:, list(stream_layers)].permute(1, 0, 2).contiguous()
            paths.append(write_v2_record(
                record_path(d, seq, pid), seq=seq, mode="EXTEND", input_ids=torch.cat([g[1] for g in group]),
                positions=torch.cat([g[2] for g in group]), requests=reqs, aux=aux, layers_to_capture=served,
                stream=stream, stream_layer_inputs=stream_layers, num_layers=self.L, hidden_size=self.H,
                declared=declared, **override))
            seq += 1
        return paths


def teacher_forced_from_demo(demo: str, tmp: str, prompts_n: int, new_tokens: int, tag: str):
    """The demo pair's first `prompts_n` prompts as a TeacherForced set: (it, the prompts file, the responses file),
    both files written under `tmp` with `tag` in their names."""
    with open(os.path.join(demo, "prompts.json")) as f:
        prompts = json.load(f)[:prompts_n]
    t = TeacherForced(prompts, os.path.join(demo, "draft"), new_tokens)
    pp = os.path.join(tmp, f"{tag}_prompts.json")
    with open(pp, "w") as f:
        json.dump(prompts, f)
    return t, pp, t.write_responses(os.path.join(tmp, f"{tag}_responses.jsonl"))


def edit_records(d: str, fn) -> str:
    """fn(i, record) on every record of a dump directory, in name order, saved back; returns `d`."""
    for i, name in enumerate(sorted(os.listdir(d))):
        p = os.path.join(d, name)
        rec = torch.load(p)
        fn(i, rec)
        torch.save(rec, p)
    return d


def write_training(d: str, seqs: Sequence[torch.Tensor], stacks: Sequence[torch.Tensor], layers: Sequence[int],
                   dtype: torch.dtype = torch.bfloat16) -> List[str]:
    """SpecForge samples rows_0-5000/data_<i>.ckpt with aux_hidden_state = the stream at these layer inputs."""
    from eagle3_capture.doctor.target_side.training_data import save_sample

    out = []
    for i, (ids, stack) in enumerate(zip(seqs, stacks)):
        T = ids.numel()
        aux = stack[:, list(layers)].reshape(T, -1).to(dtype)
        p = os.path.join(d, "rows_0-5000", f"data_{i}.ckpt")
        save_sample(p, ids, aux, stack[:, -1].to(dtype))
        out.append(p)
    return out


def write_checkpoint(d: str, tensors: Dict[str, torch.Tensor], config: dict, shards: int = 2) -> str:
    """A sharded safetensors checkpoint with model.safetensors.index.json (tensors spread over `shards` files)."""
    from safetensors.torch import save_file

    os.makedirs(d, exist_ok=True)
    names = sorted(tensors)
    wm = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n].contiguous() for n in names[s::shards]}
        if part:
            save_file(part, os.path.join(d, fname))
            wm.update({n: fname for n in part})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    return d
