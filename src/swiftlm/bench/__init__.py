"""Benchmarks for OpenAI-compatible servers: seeded workloads (workloads.py, text_gen.py), an async
load generator (client.py, sender.py), reports (report.py, plots.py), A/B comparison (ab.py,
compare.py) and the `swiftlm bench` commands (cli.py, commands.py)."""
