"""From raw text to masked-LM / next-sentence examples stored as HF datasets Arrow shards."""
