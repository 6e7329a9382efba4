"""eagle3-capture: make EAGLE-3 speculative decoding capture exactly the hidden states its draft was trained on.

Every module, one concern each (CONTRIBUTING.md draws the layout):
  spec              canonical taps (Embedding, LayerOutput(k)) and the converters between conventions (engine-free)
  configs           target and draft config.json read as SGLang reads them
  findings          declared vs captured taps, slot by slot (engine-free)
  release_table     what every engine's release table shares (version order, step tables, the table's shape)
  sglang_releases/  every SGLang release this project knows: its facts, the plugin's range, the CPU machine, the
                    doctor's serving model, the test matrix; what stock SGLang does with draft ids (pure Python)
  pipelines         how the training pipelines (SpecForge's backends, ModelOpt) read a draft config's ids
  dump_format/      the server dump: its contract and its one reader (the plugin writes, the doctor reads)
  ops               torch.ops.eagle3_capture.* wrappers, each with its fake (meta) implementation
  reference         plain-torch reference of every op (the test oracle, float64-capable)
  native            loading the compiled extension and describing the build
  tuning            the device-derived tuning table and its EAGLE3_CAPTURE_* overrides
  weights           the draft fc loader (whole or one TP rank's column shard)
  tp                the TP gather of the packed capture (PackedGatherer), with gather_backend (which backend and
                    signal) and gather_agreement (the ranks agree on each gather's arguments)
  sglang/           the SGLang plugin (entry point sglang.srt.plugins)
  doctor/           the `eagle3-capture doctor` CLI
  cli, selfcheck    the `eagle3-capture` command line and its `selfcheck`
"""
from .native import build_info

__all__ = ["build_info"]
__version__ = "0.1.0"
