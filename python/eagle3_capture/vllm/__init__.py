"""vLLM plugin: the draft's declared taps, captured exactly by vLLM's DeepseekV2 family (entry point
``vllm.general_plugins``; vLLM 0.32.0 - 0.34.0, the releases of vllm_releases/).

Modules, imported as a tree (plugin -> target -> declaration / internals; no cycle):
  plugin       entry point register(): settings, the release check, the hooks wrapped onto vLLM's classes
  target       the two hooks (set_aux_hidden_state_layers, DeepseekV2Model.forward) and the startup line
  declaration  which taps a draft config declares, as vLLM's active model runner reads it (pure Python)
  internals    what the installed vLLM offers (feature detection: the adapter)

Importing this package does not import vLLM; register() does.
"""
