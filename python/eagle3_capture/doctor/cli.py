"""The ``eagle3-capture doctor`` command line: a table of its subcommands (:data:`COMMANDS`: name, module, one line of
help), each loaded only when it is asked for, and one wiring for all of them (:func:`run_command`).

A command's module (``commands/``) owns its flags: they are the fields of its ``Options`` (``options.flag``), added to
its parser in field order; it also has ``DESCRIPTION``, ``run``, ``render`` and ``exit_code``. The parsed flags, each
checked by its type (``arg_types``) before any work, become the command's ``Options``; ``run`` returns a report;
``--json`` gets ``report.to_json()``; stdout gets ``render(report)``; the exit code is ``exit_code(report)``.

Exit codes: 0 fine, 1 an error finding (check) or a failed result, 2 bad input (a
:class:`~eagle3_capture.doctor.common.DoctorError` or a :class:`~eagle3_capture.dump_format.DumpError`, printed on one
line without a traceback, like argparse's own usage errors).
"""
from __future__ import annotations

import importlib
import sys
import types
from types import ModuleType
from typing import Optional, Sequence, Tuple

from .common import EXIT_BAD_INPUT, EXIT_FINDINGS, DeploymentFinding, DoctorError, write_json
from .options import add_arguments, options_from

# (subcommand, its module under commands/, its line in `doctor --help`), in the order --help lists them. A line may
# name {sglang_releases}: the SGLang releases modelled, read from the release table only when `doctor --help` shows
# the lines (a command line that names its subcommand loads nothing it does not need).
COMMANDS: Tuple[Tuple[str, str, str], ...] = (
    ("check", "check", "trained taps vs what stock SGLang (any release {sglang_releases}) or vLLM / the plugin "
                       "capture, config and flag traps"),
    ("fingerprint", "fingerprint", "which layer each captured slot holds (a reference, the server's own stream, or "
                                   "training data)"),
    ("dump-reference", "dump_reference", "the training side's hidden states for some prompts (transformers)"),
    ("accept", "accept", "offline draft accuracy per step and the accept length SGLang will serve"),
    ("online", "online", "a running server's accept length and per-step acceptance vs the offline replay"),
    ("demo", "demo", "the whole story on a tiny built-in DeepseekV3 target and a draft it trains"),
    ("watch", "watch", "a running server's per-position acceptance, live, from its /metrics"),
)
NAMES = tuple(name for name, _, _ in COMMANDS)
_MODULES = {name: module for name, module, _ in COMMANDS}

DESCRIPTION = ("Find why a served EAGLE-3 draft accepts less than it should: configs and server flags (check), what a "
               "server really captured (fingerprint), the draft's offline accuracy and the accept length SGLang will "
               "serve (accept), a running server beside that prediction (online), its acceptance live from /metrics "
               "(watch); `demo` runs all of it on a tiny built-in pair.")
HELP = "check configs and server flags, fingerprint captures, measure offline acceptance, watch a server, demo"


def command_module(name: str) -> ModuleType:
    """The subcommand's module, imported only when it is asked for (``check`` then loads no torch)."""
    if name not in _MODULES:
        raise ValueError(f"unknown doctor subcommand {name!r}; known: {', '.join(NAMES)}")
    return importlib.import_module(f"{__package__}.commands.{_MODULES[name]}")


def help_line(line: str) -> str:
    """A COMMANDS help line with the modelled SGLang releases filled in from the release table."""
    from ..sglang_releases.versions import NEWEST, OLDEST

    return line.replace("{sglang_releases}", f"{OLDEST}-{NEWEST}")


def requested(argv: Sequence[str]) -> Optional[str]:
    """The doctor subcommand a command line asks for (``... doctor <name> ...``), or None: the one whose module the
    parser loads. Before the name only -h/--help can come (neither parser has other options)."""
    words = [w for w in argv if not (isinstance(w, str) and w.startswith("-"))]
    if len(words) >= 2 and words[0] == "doctor" and words[1] in _MODULES:
        return words[1]
    return None


def run_command(args) -> int:
    """Every subcommand the same way: its flags -> the command's typed Options -> run -> the report to --json (when
    the command has one) -> render on stdout -> its exit code."""
    mod = command_module(args.doctor_command)
    opts = options_from(mod.Options, args)
    rep = mod.run(opts)
    if getattr(opts, "json", None):
        write_json(opts.json, rep.to_json())
    print(mod.render(rep))
    return mod.exit_code(rep)


def _one_line_error(self, message: str):
    """argparse's error, as one line: ``<prog>: error: <message>`` (no usage block), exit 2."""
    self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def one_line_errors(parser) -> None:
    parser.error = types.MethodType(_one_line_error, parser)


def add_doctor_parser(sub, argv: Optional[Sequence[str]] = None) -> None:
    """Register ``doctor`` and its subcommands on the top-level subparsers. With ``argv``, only the subcommand it asks
    for (:func:`requested`) gets its flags, from its module; the others are listed by name and help line only (they
    will not parse this command line). Without, every subcommand is complete."""
    doc = sub.add_parser("doctor", help=HELP, description=DESCRIPTION)
    one_line_errors(doc)
    ds = doc.add_subparsers(dest="doctor_command", required=True, metavar="{" + ",".join(NAMES) + "}")
    wanted = requested(argv) if argv is not None else None
    listed = wanted is None  # only `doctor --help` (no subcommand named) shows the help lines
    for name, _, help in COMMANDS:
        help = help_line(help) if listed else help
        if argv is not None and name != wanted:
            ds.add_parser(name, help=help)
            continue
        mod = command_module(name)
        s = ds.add_parser(name, help=help, description=mod.DESCRIPTION)
        add_arguments(s, mod.Options)
    for p in ds.choices.values():
        one_line_errors(p)


def bad_input(e: BaseException) -> bool:
    """Whether ``e`` says the input is bad: a DoctorError, an OSError (an output that cannot be written, a file
    vanishing under us), or a DumpError. That one is looked up only once the dump format is imported (it imports
    torch, which ``doctor check`` runs without); until then none can have been raised."""
    if isinstance(e, (DoctorError, OSError)):
        return True
    contract = sys.modules.get(__package__.rpartition(".")[0] + ".dump_format.contract")
    return contract is not None and isinstance(e, contract.DumpError)


def run(args) -> int:
    """Run a parsed doctor command: a bad input (:func:`bad_input`) -> one line on stderr, exit 2."""
    try:
        return run_command(args)
    except Exception as e:
        if not bad_input(e):
            raise
        if isinstance(e, DeploymentFinding):  # the input was right: what it found is about the deployment
            print(f"eagle3-capture doctor {args.doctor_command}: finding: {e}")
            return EXIT_FINDINGS
        # one line, whatever the message holds (a value quoted from a file may have had line breaks)
        message = " ".join(str(e).split())
        print(f"eagle3-capture doctor {args.doctor_command}: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


__all__ = ["COMMANDS", "NAMES", "DESCRIPTION", "HELP", "add_doctor_parser", "one_line_errors", "command_module",
           "help_line", "requested", "run_command", "bad_input", "run"]
