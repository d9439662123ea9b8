"""Convergence benchmark: LAMB vs. LAMB + K-FAC BERT pretraining through bert_pretrain, tuned and reported on
disjoint parts of one text (see cli.py for the commands, docs/studies/defaults.md for the method)."""
