"""docs/sglang_releases.md says what sglang_releases/ models: every cell of its two tables under the columns the
generator (scripts/sglang_releases_table.py) writes equals the generator's output for the same row. Columns added
by hand (e.g. how the plugin attaches) are left alone."""
from __future__ import annotations

import importlib.util
import os

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
