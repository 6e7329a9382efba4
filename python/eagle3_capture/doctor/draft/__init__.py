"""The draft side: an EAGLE-3 draft in plain torch, as SGLang 0.5.23 serves it, loaded for a target.

* ``side``: the draft loaded for a target (declared taps read against its layer count and width, ``--taps``, its
  dtype, its vocabulary);
* ``checkpoint``: a draft directory (config.json + safetensors) to and from the model;
* ``model``: the Llama layout (SpecForge / SGLang ``llama_eagle3``): fc, one decoder layer, chain and tree rows;
  ``mla``: the MLA attention of ``Eagle3DeepseekV2ForCausalLM``; ``layers``: what the two share (RMSNorm, RoPE
  kind, attention over the prefix and the draft's own rows).
"""
