"""The text of ``doctor demo``'s report (also its report.txt), from what :mod:`.run` measured."""
from __future__ import annotations

from ...spec import EMBEDDING
from ..fingerprint.reference import render as render_fp

# the findings about server flags (the report groups check's findings: the capture, the flags, the configs)
_FLAG_CODES = {"draft-tokens-capped", "draft-tokens-raised", "single-step-chain", "speculative-flags-crash",
               "draft-tree-too-small", "no-draft-steps", "wrong-algorithm", "no-speculative-algorithm",
               "tbo-drops-taps", "pp-drops-taps", "dp-attention", "dp-attention-final-boundary"}



def report_text(S, trained, miswired, m_ok, m_mis, taus, served, res, default, rep, fp_ok, log, timings, out_dir, fast,
            dev, failures, notes=()) -> str:
    """The demo's report: the pair, offline accuracy correct vs miswired, the accept lengths, check and fingerprint
    on the miswired capture grouped by what they are about, the files written."""
    run = S["run"]
    L = trained.num_layers
    steps = m_ok.steps
    lines = [
        "eagle3-capture doctor demo" + (" (fast)" if fast else ""),
        f"target: tiny DeepseekV3 (transformers), L={L}, H={trained.hidden_size}, seeded; device {dev}",
        f"draft:  EAGLE-3 (fc + 1 decoder layer + lm head), trained {log['iters']} steps in {log['seconds']:.0f}s on "
        f"{run['train_prompts']} greedy continuations, taps {list(trained.taps)} = draft ids {trained.to_draft_ids()}",
        f"miswired server: layers_to_capture {[0 if t == EMBEDDING else t.k + 1 for t in miswired.taps]} = "
        f"{list(miswired.taps)} (no embedding, every slot one tap later, as in the real case)",
        "",
        f"offline accuracy on {run['eval_prompts']} held-out prompts ({m_ok.anchors} positions), top-1 vs the "
        "target's greedy token:",
        "  step   correct (teacher-forced / conditional)   miswired (teacher-forced / conditional)",
    ]
    for j in range(steps):
        lines.append(f"  {j + 1:>4}   {m_ok.teacher_forced[j]:>7.3f} / {m_ok.conditional[j]:.3f}"
                     f"                      {m_mis.teacher_forced[j]:>7.3f} / {m_mis.conditional[j]:.3f}")
    def sv(name, i):
        s = served[name][i]
        return f"{s.served_accept_length:.2f} ({s.completion_tokens}/{s.verify_ct})"

    lines += [
        f"accept length, {run['new_tokens']} new tokens per prompt: served = tokens / verifies along SGLang's loop "
        "(what its meta_info reports); tau = mean over every position of 1 + accepted (no server reports it):",
        f"  SGLang defaults (num-steps {default.steps}, topk {default.topk}, draft tokens {default.draft_tokens}): "
        f"correct served {sv('correct', 1)} tau {taus['correct'][1]:.2f}; miswired served {sv('miswired', 1)} tau "
        f"{taus['miswired'][1]:.2f}",
        f"  demo flags {S['server_args']!r} -> SGLang serves num-steps {res.steps}, draft tokens {res.draft_tokens}: "
        f"correct served {sv('correct', 0)} tau {taus['correct'][0]:.2f}; miswired served {sv('miswired', 0)} tau "
        f"{taus['miswired'][0]:.2f}",
    ]
    if rep.fingerprint is not None:
        lines += ["", "doctor fingerprint of the miswired capture (a bfloat16 server's, vs the float32 reference):"]
        lines += ["  " + ln for ln in render_fp(rep.fingerprint).splitlines()]
    lines += ["", "doctor check on the miswired deployment (target + draft configs, the flags above, reference + "
                  "capture):"]
    groups = (("the capture as measured (fingerprint against the reference)", lambda f: f.code.startswith("fingerprint")),
              ("the server flags", lambda f: f.code in _FLAG_CODES),
              (f"the configs on stock SGLang {rep.release.version} (without the plugin)", lambda f: True))
    seen = set()
    for title, pick in groups:
        chosen = [f for f in rep.findings if f.severity != "info" and id(f) not in seen and pick(f)]
        if not chosen:
            continue
        seen.update(id(f) for f in chosen)
        lines.append(f"  {title}:")
        last_fix = None
        for f in chosen:
            lines.append(f"    [{f.severity}] {f.code}: {f.message}")
            if f.fix and f.fix != last_fix:
                lines.append(f"        fix: {f.fix}")
            last_fix = f.fix
    ok_slots = sum(1 for m in fp_ok.matches if m.declared is not None and m.best == m.declared)
    lines += ["", f"fingerprint of the correct capture (what the plugin captures): {ok_slots}/{len(fp_ok.matches)} "
                  f"slots are the declared taps"]
    lines += ["", f"files in {out_dir}: target/, draft/, prompts.json, reference.safetensors, captured_*.safetensors, "
                  "report.json, report.txt" + (", accuracy.png" if "plot" in timings else ""),
              "timings (s): " + ", ".join(f"{k} {v}" for k, v in timings.items())]
    lines += [f"note: {n}" for n in notes]
    lines.append("result: " + ("OK -- the correct capture is well above the miswired one, and check/fingerprint "
                               "name the fault" if not failures else "FAILED: " + "; ".join(failures)))
    return "\n".join(lines)


__all__ = ["report_text"]
