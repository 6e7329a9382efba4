"""Opening the target side, the one way ``accept`` and ``online`` do it: whichever kind the flags name, the target
side and the embedding / lm_head a draft lacking them takes from the target (SGLang shares the target's).

=========================================  ===========================================  =============================
the flags                                  the target side                              embedding, lm_head
=========================================  ===========================================  =============================
``--target PATH|demo``                     a transformers model run here                the model's own
``--server URL --dump DIR`` (online)       the server's teacher-forced pass and its     read alone from
                                           dump (:class:`TeacherForcing` says what)     ``--target-checkpoint``'s
``--hidden-states DIR``, or ``--dump DIR`` a recorded dump of that pass                 shard, when given
with a recorded ``--server FILE``
=========================================  ===========================================  =============================

Which combinations of flags a command accepts is the command's to say (its messages name its flags).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from ..progress import on_terminal
from .checkpoint import CheckpointSide
from .side import TargetSide


@dataclass(frozen=True)
class TeacherForcing:
    """What the teacher-forced pass through a live server needs: its URL, the prompts and the server's continuation
    of each, the draft steps the last verifies look past them, and how long and how many at once to ask."""

    url: str
    prompts: Sequence[List[int]]
    outputs: Sequence[List[int]]
    steps: int
    timeout: float
    concurrency: int


@dataclass
class OpenedTarget:
    side: TargetSide
    embed: Any      # a tensor, a function that reads it (from the checkpoint's shard), or None
    lm_head: Any


def open_target(target: Optional[str], checkpoint: CheckpointSide, *, device: str, seed: int = 0,
                progress: bool = False, dump: Optional[str] = None, dump_flag: str = "--hidden-states",
                vocab_size: Optional[int] = None, server: Optional[TeacherForcing] = None) -> OpenedTarget:
    """The target side: a transformers model (``target``), else the live server's teacher-forced pass read from
    ``dump`` (``server``), else the recorded dump ``dump``. ``checkpoint``: ``--target-checkpoint`` (config,
    tokenizer, embedding / lm_head read alone), empty without one; ``vocab_size``: the target's vocabulary where the
    checkpoint does not say it."""
    if target is not None:
        from .model_side import TransformersTarget

        # transformers' own weight-loading bar only where a bar belongs: on a terminal
        side = TransformersTarget.load(target, device=device, seed=seed, quiet=not (progress and on_terminal()))
        m = side.target.model
        return OpenedTarget(side, m.get_input_embeddings().weight.detach(), m.get_output_embeddings().weight.detach())
    vocab = checkpoint.vocab_size or vocab_size
    if server is not None:
        from .server_side import ServerTarget

        side = ServerTarget.teacher_force(server.url, dump, server.prompts, server.outputs, server.steps,
                                          timeout=server.timeout, concurrency=server.concurrency, progress=progress,
                                          checkpoint_config=checkpoint.config, vocab_size=vocab,
                                          tokenizer=checkpoint.tokenizer)
    else:
        from .dump_side import DumpTarget

        side = DumpTarget(dump, checkpoint.config, vocab, checkpoint.tokenizer, flag=dump_flag)
    embed, head = checkpoint.weights(side.info, device)
    return OpenedTarget(side, embed, head)


__all__ = ["TeacherForcing", "OpenedTarget", "open_target"]
