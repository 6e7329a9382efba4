"""The fingerprint: which hidden state each captured slot really holds, whatever the configs say.

* ``reference``: slots against a transformers model's hidden states (``doctor dump-reference``'s file), by cosine;
  ``files`` reads and checks that file and the captures; ``cosine_table`` streams the cosines one reference column
  at a time; ``reference_dump`` writes the reference;
* ``stream``: with no reference model, the served slots against the server's own residual stream in its dump (and
  the embedding bit for bit against ``embed_tokens``); ``stream_match`` tells which layer a slot holds (exact /
  clear / ambiguous at the noise);
* ``training``: SpecForge's training data against the server on the same token ids.
"""
