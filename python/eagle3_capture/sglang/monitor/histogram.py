"""Counting the correct drafts of every verify, where SGLang counts them for the response.

SGLang (every release 0.5.12-0.5.23) builds a request's ``spec_correct_drafts_histogram`` with
``Req.update_spec_correct_drafts_histogram(num_correct_drafts)``, once per request and verify. The AROUND hook
(group ``acceptance``) calls it, then adds one to this process's own histogram, ``COUNTS[k] += 1``: no lock, no
prometheus_client, no torch, no device synchronisation (k is the Python int SGLang already holds on the host). A
flush thread (monitor/live.py) reads ``COUNTS`` every second and exports the difference.

Only one process of a server's TP group counts: the one whose responses carry the histograms, i.e. SGLang's own
"rank zero" of the scheduler that streams outputs -- attention-TP rank 0, attention-CP rank 0, pipeline rank 0 (of
each attention-DP group). Prometheus' multiprocess collector sums counters over processes, so every verify is then
counted once. The rank is read once, at the target's model load (SGLang's parallel groups exist by then), and
kept.

One writer (the scheduler thread) and one reader (the flush thread): ``list(COUNTS)`` is a copy made under the GIL;
an increment the copy misses is in the next one, so the exported totals are exact after the last flush.
"""
from __future__ import annotations

from typing import List, Optional, Tuple

from ..installed import internals
from ..settings import switches

HISTOGRAM_PATH = internals.ACCEPTANCE_HISTOGRAM_PATH

COUNTS: List[int] = []    # COUNTS[k]: verifies of this process that accepted k drafts, since the process started
_on = False               # this process counts (decided at model load)
_bad_value_said = False


def update_histogram_hook(original, self, num_correct_drafts, *args, **kwargs):
    """AROUND ``Req.update_spec_correct_drafts_histogram``: SGLang's histogram first, then ours."""
    result = original(self, num_correct_drafts, *args, **kwargs)
    if _on:
        try:
            if num_correct_drafts >= 0:  # a negative index would count into the last bin
                COUNTS[num_correct_drafts] += 1
            else:
                _bad_value(num_correct_drafts)
        except IndexError:
            _grow(num_correct_drafts)
        except TypeError:
            _bad_value(num_correct_drafts)
    return result


def _grow(k) -> None:
    COUNTS.extend([0] * (k + 1 - len(COUNTS)))
    COUNTS[k] += 1


def _bad_value(k) -> None:
    global _bad_value_said
    if not _bad_value_said:
        _bad_value_said = True
        switches.announce("error", f"eagle3_capture: a verify reported {k!r} correct drafts (expected an integer "
                                   ">= 0); such verifies are not counted")


def snapshot() -> List[int]:
    """A copy of this process's histogram (atomic under the GIL)."""
    return list(COUNTS)


def start(positions: int) -> None:
    """Count from now on (bins 0..positions preallocated: the hook's common path never grows the list)."""
    global _on
    if len(COUNTS) < positions + 1:
        COUNTS.extend([0] * (positions + 1 - len(COUNTS)))
    _on = True


def stop() -> None:
    global _on
    _on = False


def counting() -> bool:
    return _on


def output_rank() -> Tuple[Optional[bool], str]:
    """(whether this process is the one whose responses carry the histograms, how it was decided) from SGLang's
    parallel groups: attention-TP rank, attention-CP rank and pipeline rank all 0. (None, why) when they cannot be
    read (the groups are not initialised)."""
    try:
        from sglang.srt.distributed import parallel_state as ps
    except Exception as e:  # never on a release in range; said, not raised
        return None, f"sglang.srt.distributed.parallel_state does not import ({type(e).__name__}: {e})"
    ranks = {}
    for name, read in (("attention-TP", getattr(ps, "get_attn_tensor_model_parallel_rank", None)),
                       ("attention-CP", getattr(ps, "get_attn_context_model_parallel_rank", None)),
                       ("pipeline", lambda: ps.get_pp_group().rank_in_group)):
        if read is None:
            continue  # a release without that dimension: rank 0 of it
        try:
            ranks[name] = int(read())
        except Exception as e:
            return None, f"the {name} rank cannot be read ({type(e).__name__}: {e})"
    if "attention-TP" not in ranks:
        return None, "this SGLang has no get_attn_tensor_model_parallel_rank"
    text = ", ".join(f"{k} rank {v}" for k, v in ranks.items())
    return all(v == 0 for v in ranks.values()), text


def tp_rank() -> Optional[int]:
    """This process's TP rank from SGLang's parallel groups (None when they cannot be read)."""
    try:
        from sglang.srt.distributed import parallel_state as ps

        return int(ps.get_tensor_model_parallel_rank())
    except Exception:
        return None


def resolved(server_args):
    """`server_args` as SGLang resolved them: from 0.5.20 its resolution keeps what it decided (a speculative flag
    left to SGLang, e.g.) beside the flags given, read through its ``resolving_view``; earlier releases wrote the
    decisions into the flags themselves."""
    try:
        from sglang.srt.arg_groups.model_override_base import resolving_view
    except Exception:  # a release before the resolution layer
        return server_args
    return resolving_view(server_args)


def reset() -> None:
    """Forget every count (tests)."""
    global _on, _bad_value_said
    _on = False
    _bad_value_said = False
    del COUNTS[:]


__all__ = ["HISTOGRAM_PATH", "COUNTS", "update_histogram_hook", "snapshot", "start", "stop", "counting",
           "output_rank", "tp_rank", "resolved", "reset"]
