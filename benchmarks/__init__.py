"""Benchmarks that print tables and write JSON: step_cost, memory, comm_volume, convergence."""
