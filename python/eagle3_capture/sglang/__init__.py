"""The SGLang plugin: the draft's declared taps, captured exactly, through the project's ops.

At the top, what ties the folders together (the only modules that import across them freely):
  plugin       entry point register() (``eagle3_capture.sglang.plugin:register``), the hook groups, their status
  served       around the model runner's forward: the self-test and the dump on served forwards (graph or eager),
               never on SGLang's warm-up or capture passes; the graph runners' graph-or-eager decision
  draft        the EAGLE-3 drafts' fc through the fused draft fc op

The folders, one concern each (its ``__init__`` says what it owns):
  installed/   what the installed SGLang offers (feature detection: the adapter, the hook paths) and whether a hook
               is really in SGLang's HookRegistry chain
  settings/    every EAGLE3_CAPTURE_* setting, validated at registration; the logger and the line writer
  taps/        which taps the target captures and how: tap ids through the tap spec, the final boundary, the fused
               write into the packed aux buffer, the draft's declaration, the doctor's residual stream
  dump/        the dump of served forwards: which forwards and rows, what a record says, writing it to disk
  monitor/     what watches serving: the capture self-test and the admission refusal, the acceptance histogram,
               its export to /metrics and the drift alarm

Arrows point down: the top modules -> monitor/, dump/ -> taps/ -> installed/, settings/. A folder's module never
imports a module at the top (tests/test_import_graph.py), and the folders import one another without a cycle.
Importing this package does not import SGLang; register() does.
"""
