"""Preconditioning math: applying decompositions to gradient matrices, and KL-clip scaling."""
