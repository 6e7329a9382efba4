"""``doctor check``: a deployment's configs and server flags read without running a model -- the taps the draft was
trained on (in every convention) against what stock SGLang (the release given, else the installed one, else the
newest modelled; or vLLM with ``--engine vllm``) and this project's plugin capture, every
inconsistency and server-flag trap with its fix, and with ``--reference`` and ``--captured`` the fingerprint of what
a server captured. The findings are :mod:`..deployment.check`'s; exit 1 on an error finding."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..common import EXIT_FINDINGS, EXIT_OK
from ..deployment.check import CheckReport, render, run_check


@dataclass(frozen=True)
class Options:
    target_config: str
    draft_config: str
    server_args: Optional[str] = None
    reference: Optional[str] = None
    captured: Optional[str] = None
    with_plugin: bool = False
    engine: str = "sglang"
    sglang_version: Optional[str] = None
    vllm_version: Optional[str] = None
    json: Optional[str] = None


def run(opts: Options) -> CheckReport:
    return run_check(opts.target_config, opts.draft_config, opts.server_args, opts.reference, opts.captured,
                     with_plugin=opts.with_plugin, sglang_version=opts.sglang_version, engine=opts.engine,
                     vllm_version=opts.vllm_version)


def exit_code(rep: CheckReport) -> int:
    return EXIT_FINDINGS if rep.errors else EXIT_OK


__all__ = ["Options", "run", "render", "exit_code"]
