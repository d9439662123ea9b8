"""KAISA distribution: which rank decomposes what, process groups, and bucketed collectives."""
