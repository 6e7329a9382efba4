"""SGLang 0.5.23 plugin: the draft's declared taps, captured exactly, through the project's ops.

Modules, one concern each, imported as a tree (plugin -> target / capture / draft -> the rest; no cycle):
  plugin       entry point register(), the hook groups, the hooks' status (on / off / not applied)
  target       tap ids through the tap spec (DeepseekV2 family), the final-boundary capture, the startup log line
  capture      packed aux buffer writes through eagle3_capture::capture_
  draft        the EAGLE-3 drafts' fc through the fused draft fc op
  served       around the model runner's forward: the self-test and the dump on served forwards (graph or eager),
               never on SGLang's warm-up or capture passes; the graph runners' graph-or-eager decision
  selftest     the capture self-test on the first served forward that captures
  dump         the dump of served forwards (budgets, which rank writes), dump_record (what a record says),
               dump_writer (host copy, background writing), stream (the doctor's residual stream)
  declaration  the draft config's tap declaration as this process read it
  hook_chain   whether a hook is really in SGLang's HookRegistry wrapper chain of an attribute
  switches     every EAGLE3_CAPTURE_* setting, validated at registration; the logger and the line writer

Importing this package does not import SGLang; register() does.
"""
