"""docs/sglang_releases.md says what sglang_releases/ models: every cell of its two tables under the columns the
generator (scripts/sglang_releases_table.py) writes equals the generator's output for the same row. Columns added
by hand (e.g. how the plugin attaches) are left alone. The README's range and adapter table, and the Makefile's
release lists, say what the same table says."""
from __future__ import annotations

import importlib.util
import os
import re

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(REPO, "docs", "sglang_releases.md")


def _generator():
    spec = importlib.util.spec_from_file_location("sglang_releases_table",
                                                  os.path.join(REPO, "scripts", "sglang_releases_table.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _tables(text):
    """Markdown tables in ``text``: {first header cell: (header, {first cell: row})}."""
    out, lines = {}, text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---"):
            header = [c.strip() for c in lines[i].strip("|").split("|")]
            rows = {}
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split(" | ")]
                rows[cells[0]] = dict(zip(header, cells))
                i += 1
            out[header[0]] = (header, rows)
        else:
            i += 1
    return out


@pytest.mark.parametrize("which, key", [("releases", "release"), ("hooks", "hook point")])
def test_doc_tables_match_the_model(which, key):
    gen = _tables(getattr(_generator(), f"{which}_table")())[key]
    doc = _tables(open(DOC).read())
    assert key in doc, f"docs/sglang_releases.md has no table whose first column is {key!r}"
    gen_header, gen_rows = gen
    doc_header, doc_rows = doc[key]
    missing = [c for c in gen_header if c not in doc_header]
    assert not missing, f"columns missing from the document: {missing}"
    assert list(doc_rows) == list(gen_rows), "rows differ (regenerate: python scripts/sglang_releases_table.py)"
    for name, row in gen_rows.items():
        for col in gen_header:
            assert doc_rows[name][col] == row[col], (name, col, doc_rows[name][col], row[col])


def _release_range(cell: str):
    """The releases a README cell names: "0.5.12, 0.5.13" (each, with its .post releases) or "0.5.14 - 0.5.16"
    (every release from the first through the last, .post releases included)."""
    from eagle3_capture import sglang_releases as sr
    from eagle3_capture.release_table import version_key

    def base(v):
        return version_key(v)[:3]

    if " - " in cell:
        first, last = (c.strip() for c in cell.split(" - "))
        return [v for v in sr.KNOWN_VERSIONS if base(first) <= base(v) <= base(last)]
    names = [c.strip() for c in cell.split(",")]
    return [v for v in sr.KNOWN_VERSIONS if any(base(v) == base(n) for n in names)]


def test_readme_states_the_tables_range_and_adapters():
    """README's range and its "Which SGLang releases" table say what the release table says: the plugin's range,
    every release of it in exactly one row, each row's adapter the table's for each of its releases."""
    from eagle3_capture import sglang_releases as sr

    text = open(os.path.join(REPO, "README.md")).read()
    assert f"SGLang ({sr.SUPPORTED_RANGE})" in text, f"README does not state the plugin's range {sr.SUPPORTED_RANGE}"
    header, rows = _tables(text)["SGLang"]
    assert header[:2] == ["SGLang", "adapter"], header
    covered = []
    for cell, row in rows.items():
        versions = _release_range(cell)
        assert versions, f"README row {cell!r} names no modelled release"
        for v in versions:
            assert sr.release(v).variant == row["adapter"], (cell, v, sr.release(v).variant, row["adapter"])
        covered += versions
    assert covered == list(sr.supported()), f"README's rows cover {covered}, the plugin serves {sr.supported()}"


def test_the_makefile_reads_its_release_lists_from_the_table():
    """The Makefile's matrix and its usage range come from the table (scripts/sglang_releases_table.py), and the
    SGLang it installs for `make test` is a release the plugin serves, pinned to the torch the Makefile installs."""
    from eagle3_capture import sglang_releases as sr

    make = open(os.path.join(REPO, "Makefile")).read()

    def assigned(name):
        m = re.search(rf"^{name} \?= (.*)$", make, re.M)
        assert m, f"the Makefile assigns no {name}"
        return m.group(1).strip()

    assert assigned("SMOKE_MATRIX") == "$(shell $(RELEASES_TABLE) matrix smoke)"
    assert assigned("RELEASE_MATRIX") == "$(shell $(RELEASES_TABLE) matrix model)"
    assert "$$($(RELEASES_TABLE) range)" in make
    # make test's SGLang: the newest release the plugin serves, read from the table (never a second list)
    assert re.search(r"^ifndef SGLANG_VERSION\nSGLANG_VERSION := \$\(lastword \$\(shell \$\(PYTHON\) "
                     r"scripts/sglang_releases_table.py supported\)\)\nendif$", make, re.M), "SGLANG_VERSION not read from the table"
    env = sr.release(sr.supported()[-1])
    assert env.plugin_supported and env.cpu_blocker is None, env
    assert env.torch_pin == assigned("TORCH_VERSION"), (env.version, env.torch_pin)
    assert sr.matrix("smoke") and all(sr.release(v).cpu_blocker is None for k in sr.MATRIX_KINDS
                                      for v in sr.matrix(k))


@pytest.mark.parametrize("argv", [["range"], ["matrix", "model"], ["cpu-blocker", "0.5.10"]])
def test_the_generator_prints_the_tables_lists(argv, capsys):
    from eagle3_capture import sglang_releases as sr

    want = {"range": sr.SUPPORTED_RANGE, "matrix": " ".join(sr.matrix("model")),
            "cpu-blocker": sr.release("0.5.10").cpu_blocker}[argv[0]]
    assert _generator().main(argv) == 0
    assert capsys.readouterr().out.strip() == want
    assert _generator().main(["matrix", "nothing"]) == 2 and "expected one of" in capsys.readouterr().err


def test_the_plugin_table_has_a_row_for_every_release_it_serves():
    """"The plugin on each release" has one row per release the plugin serves (and the newest it refuses), in the
    table's order; a release that cannot run on the CPU machine says why, in the table's words."""
    from eagle3_capture import sglang_releases as sr

    spec = importlib.util.spec_from_file_location("plugin_releases_table",
                                                  os.path.join(REPO, "scripts", "plugin_releases_table.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    header, rows = _tables(open(DOC).read())["SGLang"]
    assert header == mod.HEADER
    assert list(rows) == mod.default_versions()
    assert set(sr.supported()) <= set(rows)
    for v, row in rows.items():
        why = sr.release(v).cpu_blocker
        if why is not None:
            assert row["adapter"] == "cannot run on the CPU machine" and row["final boundary from"] == why, v
        else:
            assert row["adapter"] in sr.VARIANTS + ("refused at model load",), (v, row["adapter"])
            assert row["adapter"] == "refused at model load" or row["adapter"] == sr.release(v).variant, v
