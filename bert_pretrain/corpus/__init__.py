"""The built-in default corpus: a generated encyclopedia, with SQuAD-style questions about the same facts.

Deterministic from a seed. Countries, cities, rivers, people, companies and universities share one set of facts
(see ``world``), written as articles of several paragraphs through varied templates with cross references
(see ``writers``). Pretraining reads ``write_text``; SQuAD fine-tuning reads ``write_squad_json``.
"""

from __future__ import annotations

import random

from bert_pretrain.corpus.records import QA, Article, GeneratedCorpus, split_articles
from bert_pretrain.corpus.world import MIN_ARTICLES, build_world
from bert_pretrain.corpus.writers import write_article

__all__ = ["MIN_ARTICLES", "QA", "Article", "GeneratedCorpus", "generate_corpus", "split_articles"]


def generate_corpus(*, seed: int = 0, num_articles: int = 200) -> GeneratedCorpus:
    """``num_articles`` articles (every kind at least once, people the most), the same for the same seed."""
    rng = random.Random(seed)
    entities = build_world(rng, num_articles)
    world = {e.name: e for e in entities}
    return GeneratedCorpus(articles=[write_article(e, world, rng) for e in entities], seed=seed)
