"""What the installed SGLang offers the plugin, found by looking (never by the version string alone).

* ``internals``: the adapter for the installed release's capture code, where each hooked function lives, what is
  missing (detected once per process);
* ``hook_chain``: whether one of the plugin's hooks is really in SGLang's HookRegistry wrapper chain of an attribute
  (SGLang only logs a hook it could not apply).

Leaves: nothing here imports the rest of the plugin.
"""
