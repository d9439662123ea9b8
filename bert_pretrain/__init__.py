"""Two-phase BERT pretraining (MLM + NSP) with LAMB, with or without K-FAC, under the DeepSpeed launcher."""
