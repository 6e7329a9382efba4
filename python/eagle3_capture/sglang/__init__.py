"""SGLang 0.5.23 plugin: the draft's declared taps, captured exactly, through the project's ops.

Modules, one concern each:
  plugin    entry point register(), hook groups, checks that each hook is really in place, the startup log line
  switches  EAGLE3_CAPTURE_DISABLE / EAGLE3_CAPTURE_DUMP and the logger
  target    tap ids through the tap spec (DeepseekV2 family) and the final-boundary capture
  capture   packed aux buffer writes through eagle3_capture::capture_
  draft     the EAGLE-3 drafts' fc through the fused draft fc op
  dump      optional dump of captured slots for offline fingerprinting

Importing this package does not import SGLang; register() does.
"""
