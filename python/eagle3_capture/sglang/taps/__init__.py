"""Which taps the target captures, and how the values get into the packed buffer the draft is fed.

* ``target``: where the target process reads the draft config and SGLang's ``set_eagle3_layers_to_capture``: the
  declared taps through the tap spec (DeepseekV2 family), the startup log line;
* ``model_forward``: around ``DeepseekV2Model.forward``: the captures SGLang's own loop cannot make on the installed
  release (the final boundary, layer input 0 where it raises);
* ``capture``: the fused write (``eagle3_capture::capture_``) into SGLang's packed aux buffer;
* ``declaration``: the draft config's tap declaration as this process read it;
* ``stream``: the residual stream at more layer inputs, for the doctor's own requests (the dump decides which).

Imports only ``installed`` and ``settings`` of the plugin.
"""
