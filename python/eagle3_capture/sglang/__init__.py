"""SGLang 0.5.23 plugin: the draft's declared taps, captured exactly, through the project's ops.

Modules, one concern each, imported as a tree (plugin -> target / capture / draft -> the rest; no cycle):
  plugin       entry point register(), the hook groups, the hooks' status (on / off / not applied)
  target       tap ids through the tap spec (DeepseekV2 family), the final-boundary capture, the startup log line
  capture      packed aux buffer writes through eagle3_capture::capture_
  draft        the EAGLE-3 drafts' fc through the fused draft fc op
  selftest     the capture self-test on the first capturing forward
  dump         optional dump of captured slots for offline fingerprinting
  declaration  the draft config's tap declaration as this process read it
  hook_chain   whether a hook is really in SGLang's HookRegistry wrapper chain of an attribute
  switches     EAGLE3_CAPTURE_DISABLE / _SELFTEST / _DUMP, the logger and the startup-line writer

Importing this package does not import SGLang; register() does.
"""
