"""SGLang's server flags (the release modelled: :data:`.release.MODELLED`), as far as they decide what a served
EAGLE-3 draft gets: the speculative chain (steps / top-k / draft tokens, resolved the way ``_handle_eagle_family``
in ``sglang/srt/arg_groups/speculative_hook.py`` resolves them) and the flags under which taps go missing (two-batch
overlap, pipeline parallelism) or are captured on rows another group holds (attention DP).

Pure Python: it models SGLang's rules instead of importing SGLang, so it runs where SGLang is not installed; the
tests compare its resolution with SGLang's own function wherever SGLang is installed. The flags themselves are
read by :mod:`.server_args`.

The rules, read from SGLang 0.5.23 (file: function):

* ``speculative_hook.py: _handle_eagle_family``
  - not adaptive and ``--speculative-num-steps`` unset: ``--speculative-eagle-topk`` and
    ``--speculative-num-draft-tokens`` must be unset too (bare ``AssertionError``); then all three are chosen by
    ``_auto_choose_speculative_params``: (5, 4, 8) for ``LlamaForCausalLM`` and Grok-1, (3, 1, 4) for the DeepSeek
    family and every other architecture;
  - ``topk == 1`` and ``num_draft_tokens != num_steps + 1``: num_draft_tokens is forced to num_steps + 1 (one
    warning line in the log), so ``--speculative-num-steps 1 --speculative-num-draft-tokens 16`` serves 2;
  - ``topk > 1``, ``page_size > 1`` and an attention backend other than flashinfer / fa3 / triton: ``ValueError``;
  - num_steps set and topk unset: ``topk > 1`` compares ``None`` with an int: ``TypeError``.
* ``eagle_utils.py: organize_draft_results``: the draft tree offers ``topk + (num_steps - 1) * topk**2``
  candidates; ``torch.topk(..., num_draft_tokens - 1)`` fails at the first speculative decode when more are
  asked for (nothing checks it at startup).
* ``deepseek_v2.py: DeepseekV2Model.forward``: with two-batch overlap a batch that can run it (``can_run_tbo``)
  runs layers ``first_k_dense_replace..L-1`` through ``model_forward_stages``, which captures nothing: the taps at
  those layer inputs are missing and the packer raises ``captured n of K`` (or, with none captured, the model
  returns no aux states at all). Batches that cannot run TBO still capture: the failure is intermittent.
* ``deepseek_v2.py``: ``set_eagle3_layers_to_capture`` sets the capture on the last pipeline rank only, and each
  rank loops over its own layers: with ``--pp-size > 1`` every tap outside the last stage (the embedding always)
  is never captured.
* Attention DP (``--attn-dp-size N`` or the deprecated ``--dp-size N --enable-dp-attention``): each attention-DP
  rank drafts its own requests in its attention-TP group (``speculative/draft_parallel.py``, drafts declared
  ``SINGLE_GROUP``); residual rows can be scattered across that group at a layer boundary, where SGLang moves them
  back for the capture (``layer_boundary`` ``capture_move``) but this project's final-boundary capture cannot.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from ...findings import Finding
from ...spec import TapSpec
from .release import MODELLED
from .server_args import ServerFlags

# architectures -> _auto_choose_speculative_params (read in SGLang 0.5.23) (steps, topk, draft tokens)
_AUTO_LLAMA_LIKE = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")
AUTO_DEFAULT = (3, 1, 4)
AUTO_LLAMA = (5, 4, 8)
PAGE_TREE_BACKENDS = ("flashinfer", "fa3", "triton")

# ----------------------------------------------------------------------------------------------------------------
# the speculative chain
# ----------------------------------------------------------------------------------------------------------------

@dataclass
class SpecResolution:
    """What SGLang (the release modelled) ends up with for the three speculative flags, or the exception it raises."""

    steps: Optional[int]
    topk: Optional[int]
    draft_tokens: Optional[int]
    error: Optional[str] = None      # "AssertionError: ...", "TypeError: ...", "ValueError: ..."
    auto: bool = False               # chosen by _auto_choose_speculative_params
    forced_draft_tokens: bool = False  # the topk == 1 rule changed num_draft_tokens
    requested: Tuple[Optional[int], Optional[int], Optional[int]] = (None, None, None)

    @property
    def chain_length(self) -> Optional[int]:
        """Draft tokens a topk-1 chain proposes per verify (num_steps; draft tokens = steps + 1)."""
        if self.error or self.steps is None:
            return None
        return self.steps

    @property
    def tree_capacity(self) -> Optional[int]:
        """Candidates organize_draft_results chooses from: topk + (steps - 1) * topk**2."""
        if self.error or self.steps is None or self.topk is None or self.steps < 1 or self.topk < 1:
            return None
        return self.topk + (self.steps - 1) * self.topk ** 2


def resolve_speculative(flags: ServerFlags, architecture: Optional[str] = None) -> SpecResolution:
    """SGLang's ``_handle_eagle_family`` (read in 0.5.23) on these flags (the parts that decide steps/topk/draft
    tokens and the exceptions it raises). ``architecture``: the target's architectures[0] (picks the auto values)."""
    steps, topk, draft = flags.speculative_num_steps, flags.speculative_eagle_topk, flags.speculative_num_draft_tokens
    req = (steps, topk, draft)
    res = SpecResolution(steps, topk, draft, requested=req)
    if flags.speculative_adaptive:
        # _init_adaptive_speculative_params: topk 1 if unset, steps from the adaptive config, draft = steps + 1
        res.topk = 1 if topk is None else topk
        if steps is not None:
            res.draft_tokens = steps + 1
            res.forced_draft_tokens = draft is not None and draft != steps + 1
        return res
    if steps is None:
        if topk is not None or draft is not None:
            res.error = ("AssertionError (bare): _handle_eagle_family asserts that --speculative-eagle-topk and "
                         "--speculative-num-draft-tokens are unset when --speculative-num-steps is")
            return res
        res.steps, res.topk, res.draft_tokens = (AUTO_LLAMA if architecture in _AUTO_LLAMA_LIKE else AUTO_DEFAULT)
        res.auto = True
        steps, topk, draft = res.steps, res.topk, res.draft_tokens
    if topk is None:
        res.error = ("TypeError: '>' not supported between instances of 'NoneType' and 'int' (--speculative-num-steps "
                     "is set but --speculative-eagle-topk is not)")
        return res
    if topk == 1 and draft != steps + 1:
        res.draft_tokens = steps + 1
        res.forced_draft_tokens = True
    page = flags.page_size if flags.page_size is not None else 1
    backend = flags.attention_backend
    if topk > 1 and page > 1 and backend not in PAGE_TREE_BACKENDS:
        res.error = (f"ValueError: speculative_eagle_topk > 1 with page_size > 1 is only supported on "
                     f"{PAGE_TREE_BACKENDS}; got attention_backend={backend!r}")
    return res


# ----------------------------------------------------------------------------------------------------------------
# findings
# ----------------------------------------------------------------------------------------------------------------

def not_eagle3(flags: ServerFlags) -> Optional[str]:
    """Why these flags serve an EAGLE-3 draft without its taps (None: they do not): an algorithm other than EAGLE3
    (NEXTN is SGLang's alias of EAGLE, which feeds the draft the last hidden state). ``doctor check`` calls it the
    error finding "wrong-algorithm"; ``accept`` and ``online`` refuse to predict or compare under it."""
    algo = (flags.speculative_algorithm or "").upper()
    if algo and algo != "EAGLE3":
        return (f"--speculative-algorithm {flags.speculative_algorithm}: only EAGLE3 makes SGLang capture the "
                f"target's aux hidden states; an EAGLE-3 draft served as {algo} gets the last hidden state instead of "
                "its taps, so there is no served figure to predict (doctor check: wrong-algorithm); use "
                "--speculative-algorithm EAGLE3")
    return None


def _flag_text(r: SpecResolution) -> str:
    s, k, d = r.requested
    parts = []
    for name, v in (("num-steps", s), ("eagle-topk", k), ("num-draft-tokens", d)):
        parts.append(f"{name} {v if v is not None else 'unset'}")
    return ", ".join(parts)


def speculative_findings(flags: ServerFlags, architecture: Optional[str] = None) -> Tuple[SpecResolution, List[Finding]]:
    """The resolution and what is wrong with it (each finding with its fix)."""
    out: List[Finding] = []
    algo = (flags.speculative_algorithm or "").upper()
    if not algo:
        out.append(Finding("warning", "no-speculative-algorithm",
                           "no --speculative-algorithm: the server runs without speculative decoding, the draft is "
                           "not loaded and nothing is captured",
                           "add --speculative-algorithm EAGLE3 --speculative-draft-model-path <draft>"))
    elif algo != "EAGLE3":
        out.append(Finding("error", "wrong-algorithm",
                           f"--speculative-algorithm {flags.speculative_algorithm}: only EAGLE3 makes SGLang capture "
                           "the target's aux hidden states (eagle_use_aux_hidden_state); an EAGLE-3 draft served as "
                           f"{algo} gets the last hidden state instead of its K taps",
                           "use --speculative-algorithm EAGLE3"))
    r = resolve_speculative(flags, architecture)
    if r.error:
        fix = "set all three of --speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens " \
              "(e.g. 3 1 4), or none of them"
        if r.error.startswith("ValueError"):
            fix = f"use --speculative-eagle-topk 1, --page-size 1, or --attention-backend one of {PAGE_TREE_BACKENDS}"
        out.append(Finding("error", "speculative-flags-crash",
                           f"SGLang {MODELLED} refuses these speculative flags ({_flag_text(r)}) at startup: {r.error}",
                           fix))
        return r, out
    if r.auto:
        out.append(Finding("info", "speculative-auto",
                           f"no speculative flags: SGLang {MODELLED} picks num-steps {r.steps}, eagle-topk {r.topk}, "
                           f"num-draft-tokens {r.draft_tokens} for architecture {architecture or 'unknown'}"))
    asked_steps, _, asked_draft = r.requested
    if r.forced_draft_tokens and asked_draft is not None:
        if asked_draft > r.draft_tokens:
            out.append(Finding(
                "error", "draft-tokens-capped",
                f"--speculative-num-draft-tokens {asked_draft} with --speculative-eagle-topk 1 is silently reduced "
                f"to num-steps + 1 = {r.draft_tokens} by SGLang {MODELLED} (one warning line in the log): the draft "
                f"proposes {r.steps} token{'s' if r.steps != 1 else ''} per verify, so the accept length cannot "
                f"exceed {r.draft_tokens}",
                f"for a chain of {asked_draft - 1} draft tokens use --speculative-num-steps {asked_draft - 1} "
                f"--speculative-num-draft-tokens {asked_draft}"))
        else:
            out.append(Finding(
                "warning", "draft-tokens-raised",
                f"--speculative-num-draft-tokens {asked_draft} with --speculative-eagle-topk 1 is raised to "
                f"num-steps + 1 = {r.draft_tokens} by SGLang {MODELLED}",
                f"set --speculative-num-draft-tokens {r.draft_tokens} (or fewer --speculative-num-steps)"))
    if r.steps is not None and r.steps < 1:
        out.append(Finding("error", "no-draft-steps",
                           f"--speculative-num-steps {r.steps}: the draft never runs (accept length 1)",
                           "use --speculative-num-steps >= 1"))
    elif r.steps == 1 and r.topk == 1 and not (r.forced_draft_tokens and asked_draft and asked_draft > 2):
        out.append(Finding("warning", "single-step-chain",
                           "--speculative-num-steps 1 with topk 1: one drafted token per verify, accept length "
                           "at most 2",
                           "raise --speculative-num-steps (3 is SGLang's default) if the draft's later steps are "
                           "accurate (doctor accept shows them)"))
    if r.topk is not None and r.topk < 1:
        out.append(Finding("error", "bad-topk", f"--speculative-eagle-topk {r.topk}: must be >= 1",
                           "use --speculative-eagle-topk 1"))
    cap = r.tree_capacity
    if cap is not None and r.topk > 1 and r.draft_tokens is not None and r.draft_tokens - 1 > cap:
        out.append(Finding(
            "error", "draft-tree-too-small",
            f"--speculative-num-draft-tokens {r.draft_tokens}: the draft tree of topk {r.topk} x {r.steps} steps "
            f"offers topk + (steps-1)*topk^2 = {cap} candidates, fewer than num-draft-tokens - 1 = "
            f"{r.draft_tokens - 1}; SGLang {MODELLED} does not check it at startup and torch.topk in "
            "eagle_utils.organize_draft_results fails at the first speculative decode",
            f"use --speculative-num-draft-tokens <= {cap + 1}"))
    if r.topk is not None and r.topk > 1 and r.draft_tokens is None:
        out.append(Finding("warning", "draft-tokens-unset",
                           f"--speculative-eagle-topk {r.topk} without --speculative-num-draft-tokens: "
                           f"SGLang {MODELLED} leaves num-draft-tokens unset (only topk 1 derives it from num-steps)",
                           f"set --speculative-num-draft-tokens (at most {(cap or 0) + 1} for this tree)"))
    return r, out


def _layer_input(t) -> int:
    from ...spec import Embedding

    return 0 if isinstance(t, Embedding) else t.k + 1


def parallel_findings(flags: ServerFlags, taps: Optional[TapSpec], first_k_dense_replace: Optional[int],
                      plugin: bool = True) -> List[Finding]:
    """Flags under which taps go missing or are captured on rows another rank holds."""
    out: List[Finding] = []
    if taps is None:
        return out
    L = taps.num_layers
    if flags.enable_two_batch_overlap:
        fk = first_k_dense_replace
        if fk is None:
            out.append(Finding("warning", "tbo-unknown-dense",
                               "--enable-two-batch-overlap: the target config has no first_k_dense_replace, so "
                               "which taps two-batch overlap drops cannot be told",
                               "run without --enable-two-batch-overlap, or check with a capture dump"))
        elif 0 < fk < L:
            lost = [t for t in taps.taps if _layer_input(t) >= fk]
            if lost:
                kept = [t for t in taps.taps if _layer_input(t) < fk]
                out.append(Finding(
                    "error", "tbo-drops-taps",
                    f"--enable-two-batch-overlap: a batch that runs two-batch overlap executes layers {fk}..{L - 1} "
                    f"(the MoE layers, from first_k_dense_replace = {fk}) through model_forward_stages, which captures "
                    f"nothing: taps {lost} (layer inputs >= {fk}) are missing while {kept or 'none'} are captured; "
                    f"SGLang then raises 'captured {len(kept)} of {taps.K} aux hidden states'"
                    + (" (the plugin's final boundary is still appended after the final norm, so the slots shift)"
                       if plugin and taps.includes_final_boundary else "")
                    + "; batches that cannot run TBO still capture, so it fails intermittently",
                    f"remove --enable-two-batch-overlap (taps in layers >= {fk} cannot be captured under it)"))
    pp = flags.pp_size or 1
    if pp > 1:
        out.append(Finding(
            "error", "pp-drops-taps",
            f"--pp-size {pp}: SGLang {MODELLED} sets the capture on the last pipeline rank only, and each rank loops "
            f"over its own layers, so every tap outside the last stage ({'Embedding always' if taps.includes_embedding else 'the early layers'}) "
            f"is never captured; the packer raises 'captured n of {taps.K}'",
            "serve with --pp-size 1"))
    dp = flags.attention_dp
    if dp > 1:
        if plugin and taps.includes_final_boundary:
            out.append(Finding(
                "error", "dp-attention-final-boundary",
                f"attention DP ({dp}): the draft declares the final boundary {taps.final_boundary!r}, which this "
                "project's plugin captures from the final norm; under attention DP that norm's residual rows can be "
                "scattered across the attention-TP group and the plugin raises at the first forward",
                "serve without attention DP, or retrain the draft on LayerOutput(L-2) or earlier"))
        out.append(Finding(
            "warning", "dp-attention",
            f"attention DP ({dp}): each attention-DP rank captures and drafts its own requests; the draft runs in "
            "its rank's attention-TP group (SINGLE_GROUP drafts) and SGLang moves scattered residual rows back for "
            "the capture. Nothing in the configs shows this is wired right",
            "dump the captures of one rank (EAGLE3_CAPTURE_DUMP) and run doctor fingerprint on them"))
    return out


__all__ = ["SpecResolution", "resolve_speculative", "not_eagle3", "speculative_findings", "parallel_findings",
           "AUTO_DEFAULT", "AUTO_LLAMA", "PAGE_TREE_BACKENDS"]
