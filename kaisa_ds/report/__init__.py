"""Run reports: the one metrics log (metrics.jsonl) and ``python -m kaisa_ds.report``'s plots."""
