"""Kronecker factors: per-module second-moment statistics and their running averages."""
