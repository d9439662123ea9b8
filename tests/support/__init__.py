"""Shared test fixtures: tiny models and multi-process launch helpers."""
