"""Checkpointing of the K-FAC state: export/restore, per-rank shards, atomic files."""
