#!/usr/bin/env python3
"""Print from python/eagle3_capture/sglang_releases/ (the release table the doctor, the plugin, the docs and the
Makefile read) the two tables of docs/sglang_releases.md, so the document is regenerated rather than edited by hand,
and the lists the Makefile runs:

    python scripts/sglang_releases_table.py releases       # one row per release
    python scripts/sglang_releases_table.py hooks          # one row per plugin hook point
    python scripts/sglang_releases_table.py range          # the releases the plugin serves, "0.5.12 through 0.5.23"
    python scripts/sglang_releases_table.py supported      # the same, one version after another
    python scripts/sglang_releases_table.py matrix KIND    # what make test-releases runs (KIND: smoke, model)
    python scripts/sglang_releases_table.py cpu-blocker X  # why release X cannot run on the CPU machine ("" if it can)

tests/test_sglang_releases_doc.py checks the document's cells against the same data.
"""
from __future__ import annotations

import os
import sys

# bootstrap (a script; tests load it by path): the checkout's package, installed or not
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

from eagle3_capture import sglang_releases as sr  # noqa: E402

RELEASE_COLUMNS = ["release", "torch pin", "transformers pin", "set_eagle3_layers_to_capture(ids)",
                   "capture variant (plugin adapter)", "count check", "capture-only mode", "plugin registry",
                   "CUDA graphs capture", "EAGLE worker", "the plugin", "on the CPU machine", "make test-releases",
                   "doctor's serving model"]


def release_cells(r: sr.SGLangRelease) -> list:
    check = {sr.COUNT_CHECK_NONE: "none (fc shape error in the draft)",
             sr.COUNT_CHECK_ASSERT: "AssertionError (packer finalize)",
             sr.COUNT_CHECK_RAISE: "RuntimeError (packer finalize)"}[r.count_check]
    return [r.version, r.torch_pin, r.transformers_pin, r.id_rule, r.variant, check,
            "yes" if r.capture_only_mode else "no", "yes" if r.plugin_registry else "no",
            "default layers" if r.graphs_capture_default_layers else "the ids",
            "v1 (overlap off) / v2" if r.eagle_worker_v1 else "v2",
            "serves it" if r.plugin_supported else "refuses it",
            "runs" if r.cpu_blocker is None else f"cannot run: {r.cpu_blocker}",
            {"smoke": "model-level tests + serving-loop smoke", "model": "model-level tests", None: ""}[r.matrix],
            "read in it" if r.serving_model else ""]


def releases_table() -> str:
    rows = ["| " + " | ".join(RELEASE_COLUMNS) + " |", "|" + "---|" * len(RELEASE_COLUMNS)]
    rows += ["| " + " | ".join(release_cells(r)) + " |" for r in sr.RELEASES]
    return "\n".join(rows)


def _spans(hp: sr.HookPoint):
    """(first, last, path, note) spans of consecutive releases with the same path and note."""
    out = []
    for r in sr.RELEASES:
        cur = (hp.path_in(r.version), hp.note_in(r.version))
        if out and tuple(out[-1][2:]) == cur:
            out[-1][1] = r.version
        else:
            out.append([r.version, r.version, *cur])
    return out


def hooks_table() -> str:
    rows = ["| hook point | plugin hooks (0.5.23, under `sglang.srt.`) | where each release has it |", "|---|---|---|"]
    for hp in sr.HOOK_POINTS:
        parts = []
        for first, last, path, note in _spans(hp):
            rng = first if first == last else f"{first} - {last}"
            what = f"`{path}`" if path else "none"
            if path is not None and hp.plugin_path is not None and path.split("(")[0] == hp.plugin_path:
                what = "same" + (f" (`{path[path.index('('):]}`)" if "(" in path else "")
            parts.append(f"{rng}: {what}" + (f" ({note})" if note else ""))
        plugin = f"`{hp.plugin_path}`" if hp.plugin_path else "(older equivalent only)"
        rows.append(f"| {hp.name} | {plugin} | " + "; ".join(parts) + " |")
    return "\n".join(rows)


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv) or ["releases"]
    which, rest = args[0], args[1:]
    lists = {"range": lambda: sr.SUPPORTED_RANGE, "supported": lambda: " ".join(sr.supported()),
             "matrix": lambda: " ".join(sr.matrix(*rest)), "cpu-blocker": lambda: sr.release(*rest).cpu_blocker or "",
             "releases": releases_table, "hooks": hooks_table}
    if which not in lists:
        print(f"sglang_releases_table.py: expected one of {', '.join(lists)}, got {which!r}", file=sys.stderr)
        return 2
    try:
        print(lists[which]())
    except (TypeError, ValueError) as e:  # a missing or unknown argument: one line, exit 2
        print(f"sglang_releases_table.py {which}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
