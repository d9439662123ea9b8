"""Layers: discovery of K-FAC layers in a model, per-module-type math, capture hooks."""
