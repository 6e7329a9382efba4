"""``eagle3-capture doctor``: find why a served EAGLE-3 draft accepts less than it should.

Modules, one concern each:
  common             user-facing errors (DoctorError -> exit 2), input files, prompts, JSONL records, threads
  arg_types          the CLI's argument types: every flag's type and range checked, one-line errors
  server_args        SGLang 0.5.23's speculative / parallel flag rules (modelled, checked against SGLang in tests)
  pipelines          how the training pipelines (SpecForge HF / SGLang backends, ModelOpt) read a config's ids
  checks             `doctor check`: trained taps vs stock SGLang's and the plugin's capture, config and flag traps
  fingerprint        `doctor fingerprint --reference`: which reference hidden state each captured slot is
  fingerprint_files  reading a reference and a capture (dump directory, file or safetensors) for fingerprint
  cosine_table       the cosines behind fingerprint, streamed one reference column at a time
  stream_match       which layer a slot holds, told by a residual stream (exact / clear / ambiguous at the noise)
  fingerprint_stream the served slots against the server's own stream; the embedding checked bit for bit
  fingerprint_training  SpecForge training data against the server, slot by slot and layer by layer
  fingerprint_run    `doctor fingerprint` without a reference (and the subcommand's flag checks)
  training_data      SpecForge's offline training samples (.ckpt)
  reference_dump     `doctor dump-reference`: the training side's hidden states from a transformers model
  target_side        the one interface of the target side: per prompt tokens, greedy tokens, taps
  target_model       the demo's tiny DeepseekV3, loading targets, greedy continuations, residual-stream taps
  target_transformers  the target side from a transformers model
  dump_records       reading the plugin's dump: records checked field by field, requests stitched by position
  target_stream      the target side from the server's dumped residual stream (and a recorded dump alone)
  target_server      the target side from a live server: its teacher-forced pass and its dump
  checkpoint_tensors single tensors (embed_tokens, lm_head) read alone from a target checkpoint's shard
  draft_model        an EAGLE-3 draft (SpecForge / SGLang llama_eagle3 layout) in plain torch: chain and tree rows
  draft_checkpoint   a draft checkpoint's save and load (config.json + safetensors)
  draft_side         the draft loaded for a target: declared taps, --taps, its dtype
  train              training the demo's draft
  serving            SGLang 0.5.23's speculative loop replayed (chain and tree walks, verify counts, histograms)
  replay             the draft replayed over a target side: per anchor correctness and what a verify accepts
  accept             `doctor accept`: offline accuracy per draft step, the served accept length and tau
  online             `doctor online`'s server side: responses, verdicts, the report
  online_run         `doctor online`, the run: responses, target side, draft, replay, comparison
  responses          a server's responses parsed, their counts checked against SGLang's, and online's verdict
  demo               `doctor demo`: all of the above on the built-in pair
  plots              the demo's PNG
  cli                the argparse subcommands

Nothing here imports torch at module import time except the modules that run models, so `doctor check` works
without torch being loaded (and fast).
"""
