"""The doctor without a target at Kimi-K2.5's size: time and peak memory of `doctor accept --hidden-states` and
`doctor online` (recorded responses + a recorded dump) with a Kimi-K2.5-shaped EAGLE-3 draft.

What it builds (random weights, seeded), under --work (about 5 GB; removed afterwards unless --keep):

* the draft: LlamaForCausalLMEagle3 as SpecForge's configs/kimi-k25-eagle3.json publishes it -- hidden 7168,
  intermediate 18432, 64 heads x 128 (64 KV heads), vocab 163840, draft vocab 32000 with d2t, ids [2, 30, 58] --
  in bf16, *without* embed_tokens (as SGLang, the doctor shares the target's); with --draft-arch mla the MLA
  variant SGLang serves as Eagle3DeepseekV2ForCausalLM (the target's MLA sizes and yarn RoPE, dense MLP);
* a target checkpoint directory shaped like Kimi-K2.5's: config.json (KimiK25ForConditionalGeneration, text_config
  DeepseekV3 61 layers), model.safetensors.index.json, the embedding in one shard under Kimi's
  `language_model.model.embed_tokens.weight` and a small second shard: the doctor reads the embedding alone;
* the dump of the doctor's teacher-forced requests as the plugin writes it (format eagle3-capture-dump/2): per prompt
  prompt + new tokens + steps + 1 token ids, the residual stream at the declared layer inputs [3, 31, 59] and the
  served slots, 7168 wide, bf16;
* the recorded server responses (the served figures taken from the accept run, so online's verdict is a match).

Then it runs, each in its own process, `doctor accept --hidden-states` and `doctor online --server FILE --dump DIR`,
and writes time, peak host RSS and (on a GPU) peak GPU memory per command into --out with the machine, torch and the
command line. Goal on one H200 (--device cuda, 32 prompts x 128 tokens): under 5 minutes and under the draft's
weights + 2 GB.

    python benchmarks/bench_doctor_scale.py --device cuda --out benchmarks/results/doctor_scale-h200.json
    python benchmarks/bench_doctor_scale.py --device cpu --prompts 4 --out benchmarks/results/doctor_scale-cpu.json
    python benchmarks/bench_doctor_scale.py --device cpu --prompts 4 --draft-arch mla
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))  # bootstrap: the checkout's package, installed or not

KIMI_DRAFT = {  # SpecForge configs/kimi-k25-eagle3.json
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 7168,
    "intermediate_size": 18432, "num_attention_heads": 64, "num_key_value_heads": 64, "head_dim": 128,
    "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
    "rope_scaling": None, "max_position_embeddings": 131072, "vocab_size": 163840, "draft_vocab_size": 32000,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58], "use_aux_hidden_state": True},
}
# The MLA variant (SGLang's Eagle3DeepseekV2ForCausalLM, kimi_k25_eagle3): the target's MLA sizes and yarn RoPE
# (Kimi-K2's config.json: q_lora_rank 1536, kv_lora_rank 512, qk 128 + 64, v 128, rope_theta 50000), dense MLP.
KIMI_MLA_DRAFT = {
    **{k: v for k, v in KIMI_DRAFT.items() if k not in ("num_key_value_heads", "head_dim")},
    "architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "deepseek_v3", "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "rope_theta": 50000.0,
    "max_position_embeddings": 262144,
    "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 1.0,
                     "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
}
KIMI_TARGET = {
    "architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
    "text_config": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
                    "num_hidden_layers": 61, "num_attention_heads": 64, "first_k_dense_replace": 1,
                    "vocab_size": 163840},
}
LAYER_INPUTS = [3, 31, 59]   # draft ids [2, 30, 58] as the plugin reads them: LayerOutput(2, 30, 58)
FLAGS = ("--speculative-algorithm EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 "
         "--speculative-num-draft-tokens 4")
STEPS = 3


def _randn(shape, g, std):
    """bf16 N(0, std^2), drawn a block of rows at a time (no float32 copy of a 163840 x 7168 embedding)."""
    import torch

    out = torch.empty(shape, dtype=torch.bfloat16)
    for r in range(0, shape[0], 4096):
        n = min(4096, shape[0] - r)
        out[r:r + n] = torch.randn((n,) + tuple(shape[1:]), generator=g).mul_(std)
    return out


def _attention(c: dict, g, H: int) -> dict:
    """The draft layer's attention tensors: Llama (q/k/v/o) or MLA (down, norms, up, o), 2H inputs."""
    import torch

    nh = c["num_attention_heads"]
    a = "midlayer.self_attn."
    if "q_lora_rank" not in c:
        hd = c["head_dim"]
        return {a + "q_proj.weight": _randn((nh * hd, 2 * H), g, (2 * H) ** -0.5),
                a + "k_proj.weight": _randn((nh * hd, 2 * H), g, (2 * H) ** -0.5),
                a + "v_proj.weight": _randn((nh * hd, 2 * H), g, (2 * H) ** -0.5),
                a + "o_proj.weight": _randn((H, nh * hd), g, (nh * hd) ** -0.5)}
    q, kv, nope, rope, v = (c[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                           "v_head_dim"))
    return {a + "q_a_proj.weight": _randn((q, 2 * H), g, (2 * H) ** -0.5),
            a + "q_a_layernorm.weight": torch.ones(q, dtype=torch.bfloat16),
            a + "q_b_proj.weight": _randn((nh * (nope + rope), q), g, q ** -0.5),
            a + "kv_a_proj_with_mqa.weight": _randn((kv + rope, 2 * H), g, (2 * H) ** -0.5),
            a + "kv_a_layernorm.weight": torch.ones(kv, dtype=torch.bfloat16),
            a + "kv_b_proj.weight": _randn((nh * (nope + v), kv), g, kv ** -0.5),
            a + "o_proj.weight": _randn((H, nh * v), g, (nh * v) ** -0.5)}


def make_draft(d: str, seed: int, c: dict) -> int:
    """The draft's checkpoint (config `c`); returns its bytes on disk."""
    import torch
    from safetensors.torch import save_file

    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    H, I = c["hidden_size"], c["intermediate_size"]
    V, Vd = c["vocab_size"], c["draft_vocab_size"]
    K = len(c["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    t = {"fc.weight": _randn((H, K * H), g, (K * H) ** -0.5),
         "midlayer.input_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
         "midlayer.hidden_norm.weight": torch.ones(H, dtype=torch.bfloat16),
         "midlayer.post_attention_layernorm.weight": torch.ones(H, dtype=torch.bfloat16),
         "norm.weight": torch.ones(H, dtype=torch.bfloat16),
         **_attention(c, g, H),
         "midlayer.mlp.gate_proj.weight": _randn((I, H), g, H ** -0.5),
         "midlayer.mlp.up_proj.weight": _randn((I, H), g, H ** -0.5),
         "midlayer.mlp.down_proj.weight": _randn((H, I), g, I ** -0.5),
         "lm_head.weight": _randn((Vd, H), g, H ** -0.5)}
    target_ids = torch.randperm(V, generator=g)[:Vd].sort().values
    t["d2t"] = target_ids - torch.arange(Vd)
    save_file(t, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=1)
    return sum(v.numel() * v.element_size() for v in t.values())


def make_target_checkpoint(d: str, seed: int) -> int:
    import torch
    from safetensors.torch import save_file

    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(seed + 1)
    V, H = KIMI_TARGET["text_config"]["vocab_size"], KIMI_TARGET["text_config"]["hidden_size"]
    emb = _randn((V, H), g, 1.0)
    save_file({"language_model.model.embed_tokens.weight": emb}, os.path.join(d, "model-00001-of-00002.safetensors"))
    save_file({"language_model.model.norm.weight": torch.ones(H, dtype=torch.bfloat16)},
              os.path.join(d, "model-00002-of-00002.safetensors"))
    wm = {"language_model.model.embed_tokens.weight": "model-00001-of-00002.safetensors",
          "language_model.model.norm.weight": "model-00002-of-00002.safetensors",
          # the rest of a ~1T-parameter checkpoint the doctor must never open (listed, absent on purpose)
          "language_model.model.layers.0.self_attn.kv_a_proj_with_mqa.weight": "model-00002-of-00002.safetensors"}
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": wm}, f)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(KIMI_TARGET, f, indent=1)
    return emb.numel() * emb.element_size()


def make_dump(d: str, prompts_path: str, n_prompts: int, prompt_len: int, new_tokens: int, seed: int,
              per_record: int = 4) -> int:
    """The plugin's records (eagle3-capture-dump/2) of the doctor's teacher-forced requests; returns bytes."""
    import torch

    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(seed + 2)
    V, H, L = 163840, 7168, 61
    T = prompt_len + new_tokens + STEPS + 1
    ids = [torch.randint(0, V, (T,), generator=g) for _ in range(n_prompts)]
    with open(prompts_path, "w") as f:
        json.dump([x[:prompt_len].tolist() for x in ids], f)
    total = 0
    for seq, b in enumerate(range(0, n_prompts, per_record)):
        group = ids[b:b + per_record]
        rows = T * len(group)
        stream = torch.randn(len(LAYER_INPUTS), rows, H, generator=g).to(torch.bfloat16)
        rec = {"format": "eagle3-capture-dump/2", "seq": seq, "forward_mode": "EXTEND", "graph": False,
               "input_ids": torch.cat(group), "positions": torch.arange(T).repeat(len(group)),
               "requests": [{"rid": f"eagle3-doctor-bench-{b + i}", "row_start": i * T, "row_end": (i + 1) * T,
                             "prefix_len": 0} for i in range(len(group))],
               "aux": stream.permute(1, 0, 2).reshape(rows, -1).contiguous(), "layers_to_capture": LAYER_INPUTS,
               "draft_ids": [2, 30, 58], "declared": ["LayerOutput(2)", "LayerOutput(30)", "LayerOutput(58)"],
               "declared_convention": "draft_ids", "describe": None, "stream": stream,
               "stream_layer_inputs": LAYER_INPUTS, "num_layers": L, "hidden_size": H,
               "model_class": "DeepseekV3ForCausalLM", "dtype": "torch.bfloat16", "tp_rank": 0, "tp_size": 8,
               "attn_tp_rank": 0, "attn_tp_size": 8, "dp_rank": None,
               "writer": "bench: attention-TP rank 0 (the residual stream is replicated)"}
        path = os.path.join(d, f"eagle3_capture_pid1_tp0_{seq:06d}.pt")
        torch.save(rec, path)
        total += os.path.getsize(path)
    return total


def write_responses(path: str, prompts_path: str, accept_json: str, dump: str, new_tokens: int) -> None:
    """What the server would have answered: each prompt's continuation (the dumped tokens) and the served
    figures the replay predicts."""
    from eagle3_capture.dump_format.reader import DumpReader, doctor_requests

    prompts = json.load(open(prompts_path))
    served = json.load(open(accept_json))["served"]["per_prompt"]
    reqs = {tuple(r.input_ids[:len(prompts[0])].tolist()): r for r in doctor_requests(DumpReader(dump).refresh()).values()}
    with open(path, "w") as f:
        for p, s in zip(prompts, served):
            ids = reqs[tuple(p)].input_ids
            f.write(json.dumps({"input_ids": p, "output_ids": ids[len(p):len(p) + new_tokens].tolist(), "meta_info": {
                "completion_tokens": s["completion_tokens"], "spec_verify_ct": s["verify_ct"],
                "spec_correct_drafts_histogram": s["correct_drafts_histogram"]}}) + "\n")


def child(stats_path: str, argv) -> int:
    """Run the CLI in this process; write peak host RSS and GPU memory on the way out."""
    from eagle3_capture.cli import main

    code = 1
    try:
        code = main(argv)
    finally:
        out = {"exit": code, "max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20}
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                out["gpu_peak_allocated_gb"] = torch.cuda.max_memory_allocated() / 2 ** 30
                out["gpu_peak_reserved_gb"] = torch.cuda.max_memory_reserved() / 2 ** 30
        except Exception as e:  # the figures are the point; a failure to read them is said, not hidden
            out["gpu_error"] = str(e)
        with open(stats_path, "w") as f:
            json.dump(out, f)
    return code


def run(name: str, argv, work: str, timeout: int) -> dict:
    stats = os.path.join(work, f"{name}.stats.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", stats, "--", *[str(a) for a in argv]]
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    seconds = time.time() - t0
    s = json.load(open(stats)) if os.path.exists(stats) else {}
    print(f"{name}: exit {p.returncode} in {seconds:.1f} s, peak RSS {s.get('max_rss_gb', float('nan')):.2f} GB"
          + (f", GPU peak {s['gpu_peak_allocated_gb']:.2f} GB allocated" if "gpu_peak_allocated_gb" in s else ""),
          flush=True)
    return {"command": "eagle3-capture " + " ".join(str(a) for a in argv), "exit": p.returncode,
            "seconds": round(seconds, 1), **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items()},
            "stdout_tail": p.stdout[-2500:], "stderr_tail": p.stderr[-1500:]}


def main() -> int:
    if "--child" in sys.argv:
        i = sys.argv.index("--child")
        return child(sys.argv[i + 1], sys.argv[sys.argv.index("--") + 1:])
    p = argparse.ArgumentParser(description="doctor accept / online without a target, Kimi-K2.5-shaped draft: "
                                            "time and peak memory")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--dtype", default="bfloat16", help="the draft's dtype in the doctor (bfloat16, as served)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads of the doctor")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default="/tmp/e3_doctor_scale")
    p.add_argument("--keep", action="store_true", help="keep the ~5 GB of draft, checkpoint and dump")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per doctor command")
    p.add_argument("--draft-arch", choices=["llama", "mla"], default="llama",
                   help="the draft's layout: SpecForge's LlamaForCausalLMEagle3 (default) or the MLA variant "
                        "(Eagle3DeepseekV2ForCausalLM)")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    import torch

    cfg = KIMI_MLA_DRAFT if a.draft_arch == "mla" else KIMI_DRAFT
    suffix = "-mla" if a.draft_arch == "mla" else ""
    out = a.out or os.path.join(HERE, "results", f"doctor_scale{suffix}-{a.device}.json")
    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    t0 = time.time()
    draft, ck, dump = (os.path.join(a.work, n) for n in ("draft", "target_checkpoint", "dump"))
    prompts = os.path.join(a.work, "prompts.json")
    draft_bytes = make_draft(draft, a.seed, cfg)
    embed_bytes = make_target_checkpoint(ck, a.seed)
    dump_bytes = make_dump(dump, prompts, a.prompts, a.prompt_len, a.new_tokens, a.seed)
    print(f"built in {time.time() - t0:.0f} s: draft {draft_bytes / 2 ** 30:.2f} GB (+ the target's embedding "
          f"{embed_bytes / 2 ** 30:.2f} GB read from the checkpoint's shard), dump {dump_bytes / 2 ** 30:.2f} GB",
          flush=True)
    common = ["--draft", draft, "--target-checkpoint", ck, "--prompts", prompts, "--server-args", FLAGS,
              "--batch-size", a.batch_size, "--device", a.device, "--dtype", a.dtype, "--no-progress"]
    if a.threads:
        common += ["--threads", a.threads]
    acc_json = os.path.join(a.work, "accept.json")
    runs = {"accept": run("accept", ["doctor", "accept", "--hidden-states", dump, "--new-tokens", a.new_tokens,
                                     "--json", acc_json, *common], a.work, a.timeout)}
    if runs["accept"]["exit"] == 0:
        responses = os.path.join(a.work, "responses.jsonl")
        write_responses(responses, prompts, acc_json, dump, a.new_tokens)
        runs["online"] = run("online", ["doctor", "online", "--server", responses, "--dump", dump,
                                        "--json", os.path.join(a.work, "online.json"), *common], a.work, a.timeout)
    weights_gb = (draft_bytes + embed_bytes) / 2 ** 30
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    result = {
        "command": " ".join(["python"] + sys.argv), "device": a.device, "gpu": gpu,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version()},
        "torch": torch.__version__, "prompts": a.prompts, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
        "draft": {"config": cfg, "weights_gb_with_embedding": round(weights_gb, 3)},
        "dump_gb": round(dump_bytes / 2 ** 30, 3), "goal": "under 5 minutes and under the draft's weights + 2 GB",
        "runs": runs,
    }
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {out}")
    if not a.keep:
        shutil.rmtree(a.work, ignore_errors=True)
    return 0 if all(r["exit"] == 0 for r in runs.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
