"""Hugging Face integrations: the Trainer (enable_kfac) and a hand-written accelerate loop."""
