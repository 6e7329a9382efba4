"""SGLang's launch flags (read in 0.5.23) as the doctor reads them (``--server-args``: a few flags, or a whole
``python -m sglang.launch_server ...`` line): the speculative, parallel and attention flags that decide what a served
EAGLE-3 draft gets, each value checked (a bad one is a one-line DoctorError); every other flag is kept by name in
``ignored``. What SGLang then does with them is :mod:`.flag_rules`."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..common import DoctorError

# flag -> (field, kind). kind: int | str | bool
_FLAGS: Dict[str, Tuple[str, str]] = {
    "--speculative-algorithm": ("speculative_algorithm", "str"),
    "--speculative-num-steps": ("speculative_num_steps", "int"),
    "--speculative-eagle-topk": ("speculative_eagle_topk", "int"),
    "--speculative-num-draft-tokens": ("speculative_num_draft_tokens", "int"),
    "--speculative-adaptive": ("speculative_adaptive", "bool"),
    "--speculative-draft-model-path": ("speculative_draft_model_path", "str"),
    "--page-size": ("page_size", "int"),
    "--attention-backend": ("attention_backend", "str"),
    "--prefill-attention-backend": ("prefill_attention_backend", "str"),
    "--decode-attention-backend": ("decode_attention_backend", "str"),
    "--enable-two-batch-overlap": ("enable_two_batch_overlap", "bool"),
    "--enable-dp-attention": ("enable_dp_attention", "bool"),
    "--attn-dp-size": ("attn_dp_size", "int"),
    "--dp-size": ("dp_size", "int"),
    "--dp": ("dp_size", "int"),
    "--tp-size": ("tp_size", "int"),
    "--tp": ("tp_size", "int"),
    "--pp-size": ("pp_size", "int"),
    "--pp": ("pp_size", "int"),
    "--model-path": ("model_path", "str"),
    "--model": ("model_path", "str"),
}


# the smallest value each integer flag can take (absent: 0). SGLang rejects or crashes on values below these;
# --speculative-num-steps 0 and --speculative-eagle-topk 0 are in range here so that `check` can report what
# they do as findings.
_INT_MINIMUM: Dict[str, int] = {
    "speculative_num_draft_tokens": 1, "page_size": 1, "attn_dp_size": 1, "dp_size": 1, "tp_size": 1, "pp_size": 1,
}


@dataclass
class ServerFlags:
    """The SGLang flags the doctor reads (None: not given). ``ignored``: other flags seen."""

    raw: str = ""
    # the speculative chain (flag_rules.resolve_speculative)
    speculative_algorithm: Optional[str] = None
    speculative_num_steps: Optional[int] = None
    speculative_eagle_topk: Optional[int] = None
    speculative_num_draft_tokens: Optional[int] = None
    speculative_adaptive: bool = False       # steps change while serving: no figure to predict
    speculative_draft_model_path: Optional[str] = None
    # the attention backends (a tree with a page size above 1 needs one of PAGE_TREE_BACKENDS)
    page_size: Optional[int] = None
    attention_backend: Optional[str] = None
    prefill_attention_backend: Optional[str] = None
    decode_attention_backend: Optional[str] = None
    # parallelism and overlap (under which taps go missing or sit on another rank's rows: parallel_findings)
    enable_two_batch_overlap: bool = False
    enable_dp_attention: bool = False        # with --dp-size > 1: attention DP (the older spelling)
    attn_dp_size: Optional[int] = None       # attention DP (the newer spelling)
    dp_size: Optional[int] = None
    tp_size: Optional[int] = None
    pp_size: Optional[int] = None
    model_path: Optional[str] = None
    ignored: List[str] = field(default_factory=list)

    @property
    def attention_dp(self) -> int:
        """The attention-DP width (1 = off)."""
        if self.attn_dp_size and self.attn_dp_size > 1:
            return self.attn_dp_size
        if self.enable_dp_attention and (self.dp_size or 1) > 1:
            return int(self.dp_size)
        return 1


def parse_server_args(text: Optional[str]) -> ServerFlags:
    """Parse a command line (``"--speculative-num-steps 3 ..."``, or a whole ``python -m sglang.launch_server ...``
    line). Unknown flags are kept in ``ignored``; a known flag with a bad value is a DoctorError."""
    flags = ServerFlags(raw=text or "")
    if not text:
        return flags
    try:
        toks = shlex.split(text)
    except ValueError as e:
        raise DoctorError(f"--server-args {text!r}: cannot split it like a shell would: {e}") from None
    i = 0
    while i < len(toks):
        tok = toks[i]
        i += 1
        if not tok.startswith("--"):
            continue  # program name, positional pieces
        name, eq, value = tok.partition("=")
        spec = _FLAGS.get(name.replace("_", "-") if name.startswith("--") else name)
        if spec is None:
            flags.ignored.append(name)
            if not eq and i < len(toks) and not toks[i].startswith("--"):
                i += 1  # its value
            continue
        fname, kind = spec
        if kind == "bool":
            if eq:
                low = value.lower()
                if low not in ("true", "false", "1", "0"):
                    raise DoctorError(f"--server-args: {name} takes no value (or true/false), got {value!r}")
                setattr(flags, fname, low in ("true", "1"))
            else:
                setattr(flags, fname, True)
            continue
        if not eq:
            if i >= len(toks) or (toks[i].startswith("--") and kind != "int"):
                raise DoctorError(f"--server-args: {name} needs a value")
            value = toks[i]
            i += 1
        if kind == "int":
            try:
                v = int(value)
            except ValueError:
                raise DoctorError(f"--server-args: {name} expects an integer, got {value!r}") from None
            low = _INT_MINIMUM.get(fname, 0)
            if v < low:
                raise DoctorError(f"--server-args: {name} must be >= {low}, got {v}")
            setattr(flags, fname, v)
        else:
            setattr(flags, fname, value)
    return flags


__all__ = ["ServerFlags", "parse_server_args"]
