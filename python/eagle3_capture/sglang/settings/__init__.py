"""The plugin's settings: the ``EAGLE3_CAPTURE_*`` environment, validated once when SGLang loads the plugin.

* ``switches``: the table of every setting, :func:`~.switches.read_settings`, the hooks' view of the result
  (``current()``), the logger and the line writer;
* ``alarm``: the acceptance alarm's settings (the expected profile, whether serving needs it, the drift tuning);
* ``typos``: names in the environment that look like a setting but are none (a misspelt guard refuses to serve).

Leaves: nothing here imports the rest of the plugin.
"""
