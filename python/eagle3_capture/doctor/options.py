"""A doctor command's options, each spelled once: a field of the command's frozen ``Options`` dataclass that is also
its command-line flag (:func:`flag`).

The command line adds a command's flags from its Options in field order (:func:`add_arguments`) and turns the
parsed flags back into Options (:func:`options_from`): a flag's destination is its field's name and its default the
field's default, so the API and the command line give the same run. A required flag is a field without a default.
The flags several commands take are made here once (:func:`device`, :func:`threads`, :func:`json_out`, ...), so
their help reads the same in every command.

Nothing here imports torch (``doctor check`` runs without it).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

from . import arg_types as at

FLAG = "eagle3_capture.doctor.flag"  # the metadata key of a field's flag: (names, argparse keywords)

SERVER_ARGS_HELP = ("SGLang launch flags, quoted as one string (e.g. \"--speculative-algorithm EAGLE3 "
                    "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4\"); a whole "
                    "launch_server command line works too; flags the doctor does not model are ignored")


def flag(*names: str, default: Any = None, required: bool = False, **argparse_kwargs) -> Any:
    """A field of a command's Options declared as the flag ``names`` (argparse's keywords as given: help, type,
    metavar, choices, action). ``required``: the field has no default, and the flag must be given."""
    if required:
        return dataclasses.field(metadata={FLAG: (names, dict(argparse_kwargs, required=True))})
    if argparse_kwargs.get("action") == "store_true":
        default = False
    return dataclasses.field(default=default, metadata={FLAG: (names, argparse_kwargs)})


def add_arguments(parser, options_cls) -> None:
    """Every field of ``options_cls`` as its flag on ``parser``, in field order (the order of ``--help``)."""
    for f in dataclasses.fields(options_cls):
        if FLAG not in f.metadata:
            raise TypeError(f"{options_cls.__qualname__}.{f.name} is not declared with options.flag(): every field of "
                            "a command's Options is one of its flags")
        names, kwargs = f.metadata[FLAG]
        if not kwargs.get("required") and kwargs.get("action") != "store_true":
            kwargs = dict(kwargs, default=f.default)
        parser.add_argument(*names, dest=f.name, **kwargs)


def options_from(options_cls, args):
    """The command's Options from parsed flags (each flag's value already checked by its ``arg_types`` type)."""
    return options_cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(options_cls)})


# The flags several commands take.

def device() -> Any:
    return flag("--device", default="auto", help="auto (CUDA when present), cpu, cuda")


def threads(default: Optional[int] = None, help: str = "CPU threads") -> Any:
    return flag("--threads", type=at.THREADS, default=default, help=help)


def json_out(help: str) -> Any:
    return flag("--json", metavar="OUT.json", type=at.output_file, help=help)


def no_progress(help: str = "no progress (a bar on a terminal, else one line on stderr per phase)") -> Any:
    return flag("--no-progress", action="store_true", help=help)


def seed(help: Optional[str] = None) -> Any:
    return flag("--seed", type=at.seed, default=0, help=help)


def target_checkpoint() -> Any:
    return flag("--target-checkpoint", metavar="DIR",
                help="without --target: the target's checkpoint directory; only its config, tokenizer and the tensors "
                     "the draft lacks (embed_tokens, lm_head) are read, each alone from the shard that "
                     "model.safetensors.index.json names -- never the whole model")


def draft_dtype() -> Any:
    return flag("--dtype", choices=["auto", "float32", "bfloat16"], default="auto",
                help="the draft's dtype (default auto: float32 beside --target and on the CPU, bfloat16 on a GPU "
                     "without --target)")


def profile_out() -> Any:
    return flag("--profile-out", metavar="PROFILE.json", type=at.output_file,
                help="write the expected-acceptance profile (per draft position, from the predicted histogram of "
                     "correct drafts, with the server flags) for the plugin's EAGLE3_CAPTURE_PROFILE and `doctor watch "
                     "--profile`")


def server_args(help: str = SERVER_ARGS_HELP) -> Any:
    return flag("--server-args", metavar="\"FLAGS\"", help=help)


__all__ = ["FLAG", "SERVER_ARGS_HELP", "flag", "add_arguments", "options_from", "device", "threads", "json_out",
           "no_progress", "seed", "target_checkpoint", "draft_dtype", "profile_out", "server_args"]
