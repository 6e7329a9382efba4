"""``doctor check``: a deployment's configs and server flags read without running a model -- the taps the draft was
trained on (in every convention) against what stock SGLang (the release given, else the installed one, else the
newest modelled; or vLLM with ``--engine vllm``) and this project's plugin capture, every inconsistency and
server-flag trap with its fix, and with ``--reference`` and ``--captured`` the fingerprint of what a server captured.
The flags are :class:`~..deployment.run.CheckRequest`'s fields (the demo runs the same check); the findings are
:mod:`..deployment`'s; exit 1 on an error finding."""
from __future__ import annotations

from ..common import EXIT_FINDINGS, EXIT_OK
from ..deployment.report import CheckReport, render
from ..deployment.run import CheckRequest, run_check

DESCRIPTION = ("Reads the target and draft config.json, says which taps the draft was trained on (in every "
               "convention), what stock SGLang (the release given, else the installed one, else the newest modelled) "
               "or stock vLLM (--engine vllm) and this project's plugin capture, what other SGLang releases would "
               "capture from the same ids, every inconsistency and server-flag trap, each with a fix; with "
               "--reference and --captured also fingerprints what a server captured. Exit 1 on an error finding.")

Options = CheckRequest


def run(opts: Options) -> CheckReport:
    return run_check(opts)


def exit_code(rep: CheckReport) -> int:
    return EXIT_FINDINGS if rep.errors else EXIT_OK


__all__ = ["DESCRIPTION", "Options", "run", "render", "exit_code"]
