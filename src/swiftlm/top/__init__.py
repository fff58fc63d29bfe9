"""``swiftlm top``: a live terminal view of a running server, read from its ``/metrics`` only.

``scrape`` fetches and parses the Prometheus text, ``window`` turns the scrapes of the last minute
into figures (rates and latency quantiles from counter and histogram deltas), ``view`` draws them
with rich, ``command`` is the subcommand. Nothing here imports the server or the engine.
"""
