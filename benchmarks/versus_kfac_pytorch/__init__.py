"""kaisa_ds against kfac-pytorch side by side (``python -m benchmarks.versus_kfac_pytorch``; the method in cli.py's
docstring): kfac_pytorch.py adapts kfac-pytorch, runners.py builds both libraries with the same settings,
measure.py times and amortises, agreement.py compares their gradients, report.py prints the tables."""
