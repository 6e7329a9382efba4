"""``eagle3-capture doctor``: find why a served EAGLE-3 draft accepts less than it should.

Modules, one concern each:
  common          user-facing errors (DoctorError -> exit 2), input files, prompts, threads
  server_args     SGLang 0.5.23's speculative / parallel flag rules (modelled, checked against SGLang in tests)
  checks          `doctor check`: trained taps vs stock SGLang's and the plugin's capture, config and flag traps
  fingerprint     `doctor fingerprint`: cosine table of captured slots vs reference hidden states
  reference_dump  `doctor dump-reference`: the training side's hidden states from a transformers model
  target_model    the demo's tiny DeepseekV3, loading targets, greedy continuations, residual-stream taps
  draft_model     an EAGLE-3 draft (SpecForge / SGLang llama_eagle3 layout) in plain torch, save / load
  train           training the demo's draft
  accept          `doctor accept`: offline accuracy per draft step and the predicted accept length
  demo            `doctor demo`: all of the above on the built-in pair
  plots           the demo's PNG
  cli             the argparse subcommands

Nothing here imports torch at module import time except the modules that run models, so `doctor check` works
without torch being loaded (and fast).
"""
