"""Step cost of K-FAC on BERT (``python -m benchmarks.step_cost``; the method in cli.py's docstring):
measure.py times the step kinds side by side, calibration.py the planner's rates, report.py prints the tables."""
