"""The capture dump: what the target handed its draft in served forwards, for ``doctor fingerprint`` and the doctor's
server-side replay (``EAGLE3_CAPTURE_DUMP``; the record format is eagle3_capture/dump_format/).

* ``forwards``: which served forwards and requests are dumped, within which budgets, by which rank;
* ``record``: what a record says about its forward (real rows, request boundaries, taps, ranks, process);
* ``writer``: one device-to-host copy on the serving thread, the rest (assembling, writing) on a background thread.

Imports only ``taps`` and ``settings`` of the plugin.
"""
