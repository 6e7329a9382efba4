"""The doctor's subcommands, one module each: ``check``, ``fingerprint``, ``dump_reference``, ``accept``, ``online``,
``demo``, ``watch`` (``doctor/cli.py`` lists them by name and loads one only when it is asked for).

Each module has the same five names, and ``doctor/cli.py`` wires every subcommand through them alike:

* ``Options``: the subcommand's flags as a typed, frozen dataclass, each field declared once with its flag
  (``options.flag``: names, type, help; the field's default is the flag's); each flag's type and range are checked
  by ``arg_types`` before any of this runs;
* ``DESCRIPTION``: what ``--help`` says the subcommand does;
* ``run(options)``: does the work and returns the report (no printing);
* ``render(report)``: the report as the text the command prints;
* ``exit_code(report)``: 0 fine, 1 an error finding or a mismatch (``common.EXIT_*``).

A report with ``to_json()`` is written to ``--json`` by the CLI. No command imports another: what two of them share
lives in the parts (``target_side``, ``draft``, ``replay``, ``fingerprint``, ``deployment``, ``sglang_model``,
``demo``). Nothing is imported here, so that ``doctor check`` loads no torch.
"""
