"""Optimizers for BERT: LAMB with NVIDIA Apex FusedLAMB semantics, its best available implementation, and
NVIDIA's polynomial warmup schedule."""
