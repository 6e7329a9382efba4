"""``eagle3-capture doctor``: find why a served EAGLE-3 draft accepts less than it should.

The command line and what every part shares:
  cli          the table of subcommands (name -> module, loaded when asked for), each wired the same way (flags ->
               Options -> run -> report -> render)
  options      a command's options, each one field of its Options that is also its flag; the shared flags
  arg_types    every flag's type and range, checked before any work (one-line errors, exit 2)
  common       DoctorError (bad input -> exit 2), exit codes, input files, prompts, JSON / safetensors, threads
  bounds       how big the work may get (positions, draft steps, trees, timeouts), refused beyond
  progress     progress on stderr: a bar on a terminal, one line per phase elsewhere

The parts, one package each (its ``__init__`` says what it owns):
  commands/      one module per subcommand (its flags, run, render, exit code): check, fingerprint,
                 dump_reference, accept, online, demo, watch
  target_side/   the target side behind one interface: a transformers model, a live server, a recorded dump,
                 training data; the one ``open`` of it
  draft/         the EAGLE-3 draft in plain torch (Llama and MLA layouts), its checkpoint, loaded for a target
  replay/        the draft replayed over a target side; accuracy per step and tau
  fingerprint/   which hidden state each captured slot holds (against a reference, the server's stream, training
                 data)
  sglang_model/  what the doctor knows of SGLang's server (the release it was read in: sglang_model/release.py): its
                 flags and their rules, its speculative loop, its responses, the HTTP client
  deployment/    a deployment's configs and flags read without running a model (check's findings)
  demo/          the built-in pair's story

Arrows point down: cli -> commands -> the parts -> common / bounds / progress (and the package's engine-free
modules: spec, configs, findings, sglang_releases, vllm_rules, pipelines, dump_format); the parts import one another
without a cycle, no command imports another, and no module imports a private name of another
(tests/test_import_graph.py). Nothing imports torch at module import time on the way to ``doctor check``, so it runs
without torch being loaded.
"""
