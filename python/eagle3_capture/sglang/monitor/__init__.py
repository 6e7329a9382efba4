"""What watches a serving process: its capture and its acceptance.

* ``selftest``: the capture self-test on served target forwards (at start-up, then periodically and after weight
  updates); ``admission``: while a failed self-test stands in raise mode, new requests are aborted;
* ``histogram``: this process's histogram of correct drafts per verify, counted where SGLang counts them;
* ``live``: at model load, whether this process counts and the expected profile; the flush thread that exports the
  counts and feeds the drift alarm;
* ``exporter``: the plugin's Prometheus metrics through SGLang's own ``/metrics``.

Imports only ``taps``, ``installed`` and ``settings`` of the plugin.
"""
