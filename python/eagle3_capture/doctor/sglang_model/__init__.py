"""What the doctor knows of SGLang's server and speculative loop, modelled in plain Python (read in SGLang's source;
the tests compare the models with SGLang's own code where it is installed).

* ``release``: the release the model was read in (:data:`~.release.MODELLED`, from the release table) and how it
  stands in for the release a server runs; every finding here names that release;

* ``server_args``: the launch flags the doctor reads; ``flag_rules``: how SGLang resolves the speculative flags and
  which flags lose or misplace taps (findings with fixes);
* ``serving``: SGLang's speculative loop replayed (the walk, chain and tree acceptance, what ``meta_info`` reports);
* ``responses``: a server's ``/generate`` responses parsed, their counts checked against SGLang's counters;
* ``http``: the HTTP client (``/generate``, ``/server_info``); ``server_url``: the server's base URL, checked.
"""
