"""Every doctor subcommand is wired the same way (doctor/cli.py): its argparse flags are exactly the fields of its
command's typed Options (a flag no field takes would be parsed and then ignored), and its module has run, render
and exit_code; the commands' modules are imported only when they are asked for."""
import argparse
import dataclasses

import pytest

from eagle3_capture.cli import build_parser
from eagle3_capture.doctor.cli import command_module

SUBCOMMANDS = ["check", "fingerprint", "dump-reference", "accept", "online", "demo", "watch"]


def subparsers():
    doctor = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["doctor"]
    return next(a for a in doctor._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_the_subcommands_are_the_commands():
    assert sorted(subparsers()) == sorted(SUBCOMMANDS)


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_flags_are_the_options_fields(name):
    parser = subparsers()[name]
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    mod = command_module(name)
    fields = {f.name for f in dataclasses.fields(mod.Options)}
    assert dests == fields, f"{name}: flags without a field {sorted(dests - fields)}, fields without a flag " \
                            f"{sorted(fields - dests)}"
    assert mod.Options.__dataclass_params__.frozen
    assert all(callable(getattr(mod, n)) for n in ("run", "render", "exit_code"))


def test_defaults_agree():
    """A field's default is its flag's (the API and the command line give the same run)."""
    for name, parser in subparsers().items():
        opts = command_module(name).Options
        for a in parser._actions:
            f = next((f for f in dataclasses.fields(opts) if f.name == a.dest), None)
            if f is None or f.default is dataclasses.MISSING or a.required:
                continue
            assert f.default == a.default, (name, a.dest, f.default, a.default)


@pytest.mark.parametrize("argv, loaded", [
    (["doctor", "watch", "--server", "http://127.0.0.1:9"], ["watch"]),
    (["doctor", "--help"], []),
    (["doctor", "check", "--help"], ["check"]),
    (["info"], []),
])
def test_a_command_line_loads_only_the_command_it_asks_for(argv, loaded):
    """The table in doctor/cli.py is loaded lazily: building the parser for a command line imports that command's
    module and no other (a fresh interpreter, so that no earlier test has imported them)."""
    import subprocess
    import sys

    script = ("import sys\nfrom eagle3_capture.cli import build_parser\n"
              f"build_parser({argv!r})\n"
              "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules "
              "if m.startswith('eagle3_capture.doctor.commands.')))\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == repr(loaded), p.stdout


def test_requested_reads_the_subcommand_name():
    from eagle3_capture.doctor.cli import requested

    assert requested(["doctor", "accept", "--draft", "check"]) == "accept"
    assert requested(["-h", "doctor", "-h", "online"]) == "online"
    assert requested(["doctor", "nothing"]) is None and requested(["info"]) is None and requested([]) is None
