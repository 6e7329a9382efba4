"""The target side: what a draft is judged against, per prompt -- the token sequence, the target's greedy token at
every position and the residual stream at the draft's taps -- behind one interface (``side.TargetSide``), whatever
supplies it.

* ``side``: the interface, ``TargetInfo`` (L, H, vocabulary, class), batching prompts of one length;
* ``open``: the one way ``accept`` and ``online`` open a target side (with the embedding / lm_head a draft may lack);
* the kinds: ``model_side`` (a transformers model run here, ``--target``), ``server_side`` (a live server's
  teacher-forced pass and the plugin's dump), ``dump_side`` (a recorded dump of that pass, ``--hidden-states``),
  ``training_data`` (SpecForge's offline samples, for the fingerprint);
* ``model``: loading a transformers target (or the demo's tiny DeepseekV3), its greedy continuation and residual
  stream; ``checkpoint``: single tensors (embed_tokens, lm_head) read alone from a target checkpoint's shard.
"""
