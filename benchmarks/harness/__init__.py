"""What the benchmarks share, each concept once: the machine, tables and JSON, the CLI, timing, memory readings,
BERT models and batches, spawned ranks, the decomposition interval and amortisation, and side-by-side timing.

Every benchmark measures its figures side by side in one run and writes them with the machine that made them,
so a table can always be traced to a command, a machine and a date.
"""
