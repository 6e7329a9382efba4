"""``doctor watch``'s parts: reading a server's ``/metrics`` (scrape.py), turning successive readings into per-interval
acceptance, restarts and alarms (series.py), the terminal view (view.py) and the figure (plot.py). The command that
wires them is ``commands/watch.py``. Nothing here imports the SGLang plugin: the watch sees the server only through
its Prometheus text, with the metric names of ``acceptance.names``."""
