"""The K-FAC planner: memory, traffic, decomposition balance and predicted overhead of a run, from the model's
shapes and the real assignment code, without allocating weights or starting ranks (``python -m kaisa_ds.plan``)."""
