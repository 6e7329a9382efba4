"""``eagle3-capture doctor``: find why a served EAGLE-3 draft accepts less than it should.

Modules, one concern each:
  common             user-facing errors (DoctorError -> exit 2), input files, prompts, JSONL records, threads
  arg_types          the CLI's argument types: every flag's type and range checked, one-line errors
  server_args        SGLang 0.5.23's speculative / parallel flag rules (modelled, checked against SGLang in tests)
  checks             `doctor check`: trained taps vs stock SGLang's and the plugin's capture, config and flag traps
  fingerprint        `doctor fingerprint`: which reference hidden state each captured slot is, and the findings
  fingerprint_files  reading a reference and a capture (dump directory, file or safetensors) for fingerprint
  cosine_table       the cosines behind fingerprint, streamed one reference column at a time
  reference_dump     `doctor dump-reference`: the training side's hidden states from a transformers model
  target_model       the demo's tiny DeepseekV3, loading targets, greedy continuations, residual-stream taps
  draft_model        an EAGLE-3 draft (SpecForge / SGLang llama_eagle3 layout) in plain torch: chain and tree rows
  draft_checkpoint   a draft checkpoint's save and load (config.json + safetensors)
  train              training the demo's draft
  serving            SGLang 0.5.23's speculative loop replayed (chain and tree walks, verify counts, histograms)
  accept             `doctor accept`: offline accuracy per draft step, the served accept length and tau
  online             `doctor online`: a running server (or its recorded responses) beside the same replay
  responses          a server's responses parsed, their counts checked against SGLang's, and online's verdict
  demo               `doctor demo`: all of the above on the built-in pair
  plots              the demo's PNG
  cli                the argparse subcommands

Nothing here imports torch at module import time except the modules that run models, so `doctor check` works
without torch being loaded (and fast).
"""
