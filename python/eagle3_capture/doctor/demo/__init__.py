"""``doctor demo``'s story on the built-in pair: a tiny DeepseekV3 target, a draft trained on it, the correct and a
miswired capture, check and fingerprint naming the fault.

* ``run``: the whole run (target, training, offline accuracy, artifacts, check, fingerprint, served accept lengths);
* ``report``: its text; ``train``: training the draft; ``plot``: the PNG.
"""
