"""The end-to-end main job: built-in corpus → BERT pretraining (LAMB and LAMB + K-FAC) → SQuAD → report."""
