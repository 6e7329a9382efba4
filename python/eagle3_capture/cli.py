"""`eagle3-capture` command line."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence


def _cmd_info(args) -> int:
    from .native import build_info

    info = build_info()
    if not args.no_sglang:
        try:
            from .sglang.plugin import release_summary

            info["sglang"] = release_summary()
        except Exception as e:  # a broken SGLang install is a finding, not a reason to hide the build info
            info["sglang"] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(info, indent=1))
    return 0


def _cmd_selfcheck(args) -> int:
    from . import selfcheck

    return 0 if selfcheck.run() else 1


def build_parser(argv: Optional[Sequence[str]] = None) -> argparse.ArgumentParser:
    """The command line's parser. With ``argv``, only what that command line asks for is loaded (a doctor
    subcommand's module, doctor/cli.py); without, every subcommand is complete."""
    p = argparse.ArgumentParser(prog="eagle3-capture",
                                description="Exact, cheap, checkable hidden-state capture for EAGLE-3 in SGLang.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("info", help="what the native extension was built with (backends, CUDA archs, versions), and "
                                    "the installed SGLang's release and the plugin's adapter for it")
    s.add_argument("--no-sglang", action="store_true", help="leave out the SGLang part (it imports SGLang: seconds)")
    s.set_defaults(func=_cmd_info)
    s = sub.add_parser("selfcheck", help="run every op once against the float64 reference (CPU, and CUDA if present)")
    s.set_defaults(func=_cmd_selfcheck)
    from .doctor.cli import add_doctor_parser, one_line_errors

    add_doctor_parser(sub, argv)
    one_line_errors(p)  # unrecognised arguments are reported here, after the subcommand's parser
    return p


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    if args.command == "doctor":
        from .doctor.cli import run

        return run(args)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
